"""Which DeviceTaintRules gpumon wants for a node, and finding out whether they are served."""

from __future__ import annotations

import json

from controller_fakes import FakeKube

from gpumon.controller.act.device_taint import served
from gpumon.controller.core.claims import PlacedDevice, SliceView
from gpumon.controller.core.contract import ANNOTATION_UNHEALTHY_GPUS, TAINT_KEY
from gpumon.controller.core.device_taints import (
    GROUP_VERSION_PATH,
    RuleView,
    plan_rules,
    rule_from_json,
    rule_name,
    wanted_rules,
)
from gpumon.controller.core.objects import NodeView
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, DeviceRef


def ref(device: str, pool: str = "n1") -> DeviceRef:
    return DeviceRef(NVIDIA_GPU_DRIVER, pool, device)


SLICE = SliceView(
    "n1",
    1,
    (
        PlacedDevice(ref("gpu-0"), "GPU-0", "GPU-0"),
        PlacedDevice(ref("gpu-1"), "GPU-1", "GPU-1"),
        PlacedDevice(ref("gpu-1-mig-9-4-4"), "GPU-1", "MIG-b"),
        PlacedDevice(ref("gpu-2"), "GPU-2", "GPU-2"),
    ),
)


def node(*records: tuple[str, str]) -> NodeView:
    entries = [
        {
            "uuid": uuid,
            "index": None,
            "reason": "XidFatal",
            "severity": severity,
            "rules": ["r"],
            "firstSeen": "2026-11-24T08:00:00Z",
            "evidence": "Xid 79",
        }
        for uuid, severity in records
    ]
    return NodeView("n1", "u", "1", annotations={ANNOTATION_UNHEALTHY_GPUS: json.dumps(entries)})


def test_every_device_of_an_unhealthy_gpu_is_wanted_and_nothing_else() -> None:
    view = node(("GPU-1", "unhealthy"), ("GPU-2", "degraded"), ("", "unhealthy"))
    wanted = wanted_rules("n1", view, [SLICE])
    assert [w.ref.device for w in wanted] == ["gpu-1", "gpu-1-mig-9-4-4"]
    body = wanted[0].to_json()
    assert body["spec"] == {
        "deviceSelector": {"driver": NVIDIA_GPU_DRIVER, "pool": "n1", "device": "gpu-1"},
        "taint": {"key": TAINT_KEY, "value": "unhealthy", "effect": "NoSchedule"},
    }
    assert rule_from_json(body) == RuleView(wanted[0].name, "n1")


def test_healthy_gone_and_other_nodes_want_none() -> None:
    assert wanted_rules("n1", node(), [SLICE]) == ()
    assert wanted_rules("n1", None, [SLICE]) == ()
    assert wanted_rules("n2", node(("GPU-1", "unhealthy")), [SLICE]) == ()


def test_devices_left_in_an_older_generation_of_its_pool_are_not_tainted() -> None:
    # The driver republished its pool with GPU 1 no longer split: the MIG device is gone.
    newer = SliceView("n1", 2, (PlacedDevice(ref("gpu-1"), "GPU-1", "GPU-1"),))
    wanted = wanted_rules("n1", node(("GPU-1", "unhealthy")), [SLICE, newer])
    assert [w.ref.device for w in wanted] == ["gpu-1"]


def test_plan_creates_what_is_missing_and_deletes_what_is_not_wanted_on_its_node_only() -> None:
    wanted = wanted_rules("n1", node(("GPU-1", "unhealthy")), [SLICE])
    stale = RuleView(rule_name(ref("gpu-0")), "n1")
    other = RuleView(rule_name(ref("gpu-0", "n2")), "n2")
    kept = RuleView(wanted[0].name, "n1")
    plan = plan_rules("n1", wanted, [stale, other, kept])
    assert [w.ref.device for w in plan.create] == ["gpu-1-mig-9-4-4"]
    assert plan.delete == (stale.name,)
    assert not plan_rules("n1", wanted, [kept, RuleView(wanted[1].name, "n1")])


def test_rule_names_are_per_device_triple_and_valid() -> None:
    a, b = rule_name(ref("gpu-0", "n1")), rule_name(ref("gpu-0", "n2"))
    assert a != b and a.startswith("gpumon-gpu-0-") and len(a) <= 253 and a == a.lower()


async def test_discovery_finds_the_rules_only_where_the_version_lists_them() -> None:
    api = FakeKube()
    assert not await served(api), "resource.k8s.io/v1beta2 absent (404)"
    api.add(GROUP_VERSION_PATH, {"kind": "APIResourceList", "resources": [{"name": "resourceslices"}]})
    assert not await served(api), "the version is there, the resource is not"
    api.add(
        GROUP_VERSION_PATH,
        {
            "kind": "APIResourceList",
            "resources": [{"name": "devicetaintrules"}, {"name": "devicetaintrules/status"}],
        },
    )
    assert await served(api)

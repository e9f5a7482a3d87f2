"""``gpumon status allocation``: the view built from Nodes and Pods written the way the device
plugins and scheduler extenders write them, with and without the exporters' snapshots."""

from __future__ import annotations

import json
from typing import Any

from gpumon.gpu.model import (
    HEALTHY,
    FastFields,
    GpuIdentity,
    GpuSample,
    MemoryInfo,
    MigInstance,
    PodGpuUsage,
    PodRef,
    Snapshot,
)
from gpumon.k8s import sharing
from gpumon.status import render
from gpumon.status.allocation import (
    IDLE,
    OVER_ALLOCATED,
    OVER_CORE,
    OVER_MEMORY,
    build_allocation,
    hami_cards,
    node_allocation,
)
from gpumon.wire import v1 as wire

GIB = 1 << 30
MIB = 1 << 20
UUIDS = [f"GPU-0000000{i}-0000-4000-8000-000000000000" for i in range(4)]


def node(name: str, capacity: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def pod(
    name: str,
    on: str,
    limits: dict[str, str],
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "annotations": annotations or {}},
        "spec": {"nodeName": on, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def gpushare(
    index: int, gib: int, core: int | None = None, *, assigned: str = "true"
) -> tuple[dict[str, str], dict[str, str]]:
    limits = {sharing.GPUSHARE_MEMORY_RESOURCE: str(gib)} | (
        {sharing.CGPU_CORE_RESOURCE: str(core)} if core else {}
    )
    return limits, {sharing.GPUSHARE_INDEX: str(index), sharing.GPUSHARE_ASSIGNED: assigned}


SHARE_NODE = node(
    "share",
    {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "32", "aliyun.com/gpu-core.percentage": "200"},
)


def test_gpushare_and_cgpu_shares_card_by_card() -> None:
    pods = [
        pod("a", "share", *gpushare(0, 4)),
        pod("b", "share", *gpushare(0, 8)),
        pod("c", "share", *gpushare(1, 6)),
        pod("d", "share", *gpushare(1, 4, core=30)),
        pod("placed-not-given", "share", *gpushare(1, 2, assigned="false")),
        pod("done", "share", *gpushare(1, 9), phase="Succeeded"),
    ]
    n = node_allocation(SHARE_NODE, pods)
    assert n.schemes == ("cgpu", "gpushare")
    got = {
        c.index: (
            c.memory_allocated_gib,
            c.memory_total_gib,
            c.core_allocated_percent,
            [h.pod for h in c.holders],
        )
        for c in n.cards
    }
    assert got == {0: (12, 16, 0, ["ml/a", "ml/b"]), 1: (10, 16, 30, ["ml/c", "ml/d"])}
    d = n.cards[1].holders[1]
    assert (d.scheme, d.memory_gib, d.core_percent, d.flags) == ("cgpu", 4, 30, ())
    # Bound by the scheduler, not yet allocated on a card.
    assert [(h.pod, h.memory_gib) for h in n.unplaced] == [("ml/placed-not-given", 2)]
    assert n.devices == {}


def test_an_over_allocated_card_is_flagged() -> None:
    n = node_allocation(
        SHARE_NODE, [pod("a", "share", *gpushare(0, 10, 60)), pod("b", "share", *gpushare(0, 10, 50))]
    )
    assert n.cards[0].flags == (OVER_ALLOCATED,) and n.cards[1].flags == ()


def test_hami_cards_from_the_device_plugins_registration() -> None:
    legacy = "".join(
        f"{u},10,32768,100,NVIDIA-Tesla V100,0,true,{i},hami-core:" for i, u in enumerate(UUIDS[:2])
    )
    modern = json.dumps(
        [{"id": UUIDS[1], "count": 10, "devmem": 16384, "devcore": 100, "type": "NVIDIA", "index": 1}]
    )
    assert [(c.index, c.uuid, c.memory_bytes) for c in hami_cards(legacy)] == [
        (0, UUIDS[0], 32 * GIB),
        (1, UUIDS[1], 32 * GIB),
    ]
    assert [(c.index, c.uuid, c.memory_bytes) for c in hami_cards(modern)] == [(1, UUIDS[1], 16 * GIB)]
    assert hami_cards("not json [") == () and hami_cards(None) == ()
    hami = node("hami", {"nvidia.com/gpu": "20"}, {"hami.io/node-nvidia-register": legacy})
    pods = [
        pod("h", "hami", {"nvidia.com/gpu": "1"}, {sharing.HAMI_ALLOCATED: f"{UUIDS[1]},NVIDIA,4096,40:;"}),
        pod("waiting", "hami", {"nvidia.com/gpu": "1"}),  # HAMi's scheduler has not placed it yet
    ]
    n = node_allocation(hami, pods)
    assert n.schemes == ("hami",) and n.devices == {}  # nvidia.com/gpu counts virtual GPUs here
    assert [
        (c.index, c.memory_allocated_gib, c.core_allocated_percent, [h.pod for h in c.holders])
        for c in n.cards
    ] == [
        (0, 0, 0, []),
        (1, 4, 40, ["ml/h"]),
    ]
    assert [(h.pod, h.scheme) for h in n.unplaced] == [("ml/waiting", "hami")]


def gpu(index: int, used_gib: float, util: float) -> GpuSample:
    return GpuSample(
        GpuIdentity(index, UUIDS[index], "A100", f"0000:0{index}:00.0"),
        FastFields(memory=MemoryInfo(80 * GIB, int(used_gib * GIB), 0), utilization_ratio=util),
        None,
        HEALTHY,
        0.0,
    )


def usage(name: str, index: int, used_gib: float, util: float | None, **fields: Any) -> PodGpuUsage:
    return PodGpuUsage(PodRef("ml", name, "main"), index, UUIDS[index], int(used_gib * GIB), util, **fields)


def snap(gpus: list[GpuSample], pods: list[PodGpuUsage]) -> wire.SnapshotDoc:
    return wire.snapshot_document(Snapshot("n", None, tuple(gpus), tuple(pods), 0.0, True, True))


def test_whole_gpus_and_mig_devices_are_counted_per_node_and_placed_by_the_exporter() -> None:
    whole = node("whole", {"nvidia.com/gpu": "4"})
    pods = [pod("one", "whole", {"nvidia.com/gpu": "1"}), pod("two", "whole", {"nvidia.com/gpu": "2"})]
    n = node_allocation(whole, pods)
    assert n.devices == {"nvidia.com/gpu": (3, 4)} and n.cards == ()
    assert [(h.pod, h.gpus) for h in n.unplaced] == [("ml/one", 1), ("ml/two", 2)]
    # The exporter saw pod-resources give "one" GPU 2 and "two" GPUs 0 and 1.
    given = ("nvidia.com/gpu",)
    seen = snap(
        [gpu(0, 10, 0.5), gpu(1, 0, 0.0), gpu(2, 1, 0.1), gpu(3, 0, 0.0)],
        [
            usage("two", 0, 10, 0.5, allocated_resources=given),
            usage("two", 1, 0, 0.0, allocated_resources=given),
            usage("one", 2, 1, 0.1, allocated_resources=given),
        ],
    )
    n = node_allocation(whole, pods, seen, "http://exporter", None)
    assert [
        (c.index, c.memory_total_gib, [(h.pod, h.gpus, h.flags) for h in c.holders]) for c in n.cards
    ] == [
        (0, 80, [("ml/two", 1, ())]),
        (1, 80, [("ml/two", 1, (IDLE,))]),
        (2, 80, [("ml/one", 1, ())]),
        (3, 80, []),
    ]
    assert n.unplaced == () and n.cards[0].memory_used_gib == 10 and n.cards[0].utilization_percent == 50

    mig = node("mig", {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"})
    pods = [
        pod("m1", "mig", {"nvidia.com/mig-1g.10gb": "2"}),
        pod("m3", "mig", {"nvidia.com/mig-3g.40gb": "1"}),
    ]
    n = node_allocation(mig, pods)
    assert n.devices == {"nvidia.com/mig-1g.10gb": (2, 14), "nvidia.com/mig-3g.40gb": (1, 4)}
    instance = MigInstance(2, 0, "3g.40gb", "MIG-x")
    seen = snap(
        [gpu(0, 0, 0), gpu(1, 0, 0)],
        [usage("m3", 1, 2, None, allocated_resources=("nvidia.com/mig-3g.40gb",), mig=instance)],
    )
    n = node_allocation(mig, pods, seen)
    assert [(c.index, [(h.pod, h.mig_profile) for h in c.holders]) for c in n.cards] == [
        (0, []),
        (1, [("ml/m3", "3g.40gb")]),
    ]
    assert [(h.pod, h.gpus, h.mig_profile) for h in n.unplaced] == [("ml/m1", 2, "1g.10gb")]


def test_use_against_the_share_flags_over_use_and_idle_allocations() -> None:
    pods = [
        pod("greedy", "share", *gpushare(0, 4)),
        pod("busy", "share", *gpushare(0, 4, core=30)),
        pod("asleep", "share", *gpushare(1, 4)),
        pod("fine", "share", *gpushare(1, 8, core=50)),
    ]
    seen = snap(
        [gpu(0, 12, 0.6), gpu(1, 3, 0.2)],
        [
            usage("greedy", 0, 5.5, 0.1),
            usage("busy", 0, 1, 0.5),
            usage("asleep", 1, 0, 0.0),
            usage("fine", 1, 3, 0.2),
        ],
    )
    n = node_allocation(SHARE_NODE, pods, seen)
    flags = {h.pod: h.flags for c in n.cards for h in c.holders}
    assert flags == {
        "ml/greedy": (OVER_MEMORY,),
        "ml/busy": (OVER_CORE,),
        "ml/asleep": (IDLE,),
        "ml/fine": (),
    }
    fine = n.cards[1].holders[1]
    assert (fine.used_memory_gib, fine.utilization_percent) == (3, 20)
    # The card's UUID comes from the exporter.
    assert [c.uuid for c in n.cards] == UUIDS[:2]


def test_the_fleet_view_keeps_gpu_nodes_only_and_renders() -> None:
    nodes = [SHARE_NODE, node("cpu", {"cpu": "8"}), node("whole", {"nvidia.com/gpu": "2"})]
    pods = [
        pod("a", "share", *gpushare(0, 4)),
        pod("w", "whole", {"nvidia.com/gpu": "1"}),
        {"metadata": {"name": "pending"}, "spec": {}},
    ]
    view = build_allocation(
        "2026-11-24T05:00:00Z", nodes, pods, {"whole": (None, "pods/x", "connection refused")}
    )
    assert [n.name for n in view.nodes] == ["share", "whole"]
    assert view.nodes[1].usage_error == "connection refused"
    doc = json.loads(render.dumps(view, "json"))
    assert doc["nodes"][0]["cards"][0]["holders"][0]["pod"] == "ml/a"
    assert doc["nodes"][1]["devices"] == {"nvidia.com/gpu": [1, 2]}
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render.allocation(view))
    text = console.export_text()
    assert "ml/a gpushare 4 GiB" in text and "4/16" in text and "connection refused" in text

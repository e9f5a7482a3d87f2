"""GPU demand of pods and the bin-packing simulation (gpumon.controller.core.demand)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
from test_autoscale_planner import NOW, make_pool, scale

from gpumon.controller.core.demand import (
    NodeSelectorTerm,
    Packer,
    PodDemand,
    SharedCards,
    Template,
    Toleration,
    is_unschedulable,
    pending_gpu_pod,
    pod_requests,
    size,
    why_not_hosted,
)
from gpumon.controller.core.objects import GpuResources, Taint, from_rfc3339
from gpumon.controller.core.scale_plan import PoolInput, plan_pools
from gpumon.k8s.resources import milli, units
from gpumon.k8s.selectors import Requirement

GPU = "nvidia.com/gpu"
MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"


def unschedulable(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": "p", "uid": "u", **meta},
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": "2026-01-01T00:00:10Z",
                }
            ],
        },
    }


def containers(*limits: dict[str, str]) -> dict[str, Any]:
    return {"containers": [{"name": f"c{i}", "resources": {"limits": lim}} for i, lim in enumerate(limits)]}


def nodes_needed(pods: list[PodDemand], template: Template) -> int:
    """New nodes of ``template`` the scale planner asks for to place ``pods`` on an empty pool."""
    pool = replace(make_pool(), template=template, max_replicas=1000, max_step=1000)
    (plan,) = plan_pools([PoolInput(pool, scale(0))], pods, NOW)
    return plan.demand_nodes


def gpus(name: str, n: int) -> PodDemand:
    return PodDemand("ml", name, f"uid-{name}", MappingProxyType({GPU: n * 1000, "pods": 1000}))


def shared_pod(name: str, mem: int, core: int = 0) -> PodDemand:
    reqs = {MEM: mem * 1000, "pods": 1000} | ({CORE: core * 1000} if core else {})
    return PodDemand("ml", name, f"uid-{name}", MappingProxyType(reqs))


WHOLE = Template(MappingProxyType({GPU: 8000}))
SHARED = Template(
    MappingProxyType({MEM: 64000, CORE: 400000, "aliyun.com/gpu-count": 4000}), shared=SharedCards(4, 16000)
)


# -- quantities -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2000),
        (2, 2000),
        ("500m", 500),
        ("1.5", 1500),
        ("1Ki", 1024000),
        ("16Gi", 16 * 2**30 * 1000),
        ("1k", 1_000_000),
        ("1e3", 1_000_000),
        ("0.0001", 1),  # rounded up, as the API server does
        (" 3 ", 3000),
    ],
)
def test_quantities_in_thousandths(text: object, expected: int) -> None:
    assert milli(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "1.2.3", "Gi", "--1"])
def test_not_quantities(text: str) -> None:
    assert milli(text) is None


def test_units_for_people() -> None:
    assert units(2000) == "2" and units(500) == "0.5"


# -- parsing pods ----------------------------------------------------------------------------


def test_unschedulable_gpu_pod_becomes_demand() -> None:
    obj = unschedulable(
        {
            **containers({GPU: "2", "cpu": "4"}, {"memory": "1Gi"}),
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 100,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                        ]
                    }
                }
            },
        }
    )
    d = pending_gpu_pod(obj, GpuResources(), from_rfc3339)
    assert d is not None
    assert d.key == "ml/p" and d.uid == "u" and d.priority == 100
    assert dict(d.requests) == {GPU: 2000, "cpu": 4000, "memory": 2**30 * 1000, "pods": 1000}
    assert dict(d.node_selector) == {"pool": "a"}
    assert d.tolerations == (Toleration("gpu", "Exists", "", "NoSchedule"),)
    assert d.affinity == (NodeSelectorTerm((Requirement("zone", "In", frozenset({"a", "b"})),)),)
    assert d.pending_since == from_rfc3339("2026-01-01T00:00:10Z")


@pytest.mark.parametrize(
    "limits",
    [
        {MEM: "5"},
        {CORE: "30"},
        {"nvidia.com/mig-1g.10gb": "1"},
        {GPU: "1"},
        {"windows.alibabacloud.com/directx": "1"},
        {"nvidia.com/gpucores": "30"},
    ],
)
def test_every_kind_of_gpu_request_is_demand(limits: dict[str, str]) -> None:
    assert pending_gpu_pod(unschedulable(containers(limits)), GpuResources(), from_rfc3339) is not None


def test_cpu_pods_are_not_gpu_demand() -> None:
    assert pending_gpu_pod(unschedulable(containers({"cpu": "1"})), GpuResources(), from_rfc3339) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o["spec"].update(nodeName="n1"),  # bound
        lambda o: o["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
        lambda o: o["status"].update(phase="Failed"),
        lambda o: o["status"]["conditions"][0].update(reason="SchedulingGated"),
        lambda o: o["status"]["conditions"][0].update(status="True"),
        lambda o: o["status"].update(conditions=[]),  # not looked at by the scheduler yet
    ],
)
def test_only_pods_the_scheduler_refused_are_demand(change: Any) -> None:
    obj = unschedulable(containers({GPU: "1"}))
    assert is_unschedulable(obj)
    change(obj)
    assert not is_unschedulable(obj)
    assert pending_gpu_pod(obj, GpuResources(), from_rfc3339) is None


def test_requests_override_limits_and_zero_is_dropped() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {GPU: "2", "cpu": "8"}, "requests": {"cpu": "2", "memory": "0"}}}
        ]
    }
    assert pod_requests(spec) == {GPU: 2000, "cpu": 2000, "pods": 1000}


def test_init_containers_count_at_their_peak_and_sidecars_add_up() -> None:
    spec = {
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "setup", "resources": {"requests": {"cpu": "6", GPU: "1"}}},
        ],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}],
        "overhead": {"cpu": "250m"},
    }
    # init peak: sidecar 1 + setup 6 = 7 > sidecar 1 + main 2 = 3; overhead on top.
    assert pod_requests(spec) == {"cpu": 7250, GPU: 1000, "pods": 1000}


def test_affinity_by_field_cannot_match_a_node_that_does_not_exist_yet() -> None:
    obj = unschedulable(
        {
            **containers({GPU: "1"}),
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                        ]
                    }
                }
            },
        }
    )
    d = pending_gpu_pod(obj, GpuResources(), from_rfc3339)
    assert d is not None and why_not_hosted(WHOLE, d) == "required node affinity"


# -- can a template host it ------------------------------------------------------------------


def with_(pod: PodDemand, **changes: Any) -> PodDemand:
    from dataclasses import replace

    return replace(pod, **changes)


def test_taints_need_tolerations_except_prefer_no_schedule() -> None:
    t = Template(
        WHOLE.resources,
        taints=(Taint("gpu", "NoSchedule", "true"), Taint("soft", "PreferNoSchedule")),
    )
    p = gpus("a", 1)
    assert why_not_hosted(t, p) == "untolerated taint gpu=true:NoSchedule"
    assert (
        why_not_hosted(t, with_(p, tolerations=(Toleration("gpu", "Equal", "true", "NoSchedule"),))) is None
    )
    assert why_not_hosted(t, with_(p, tolerations=(Toleration("gpu", "Equal", "false"),))) is not None
    assert why_not_hosted(t, with_(p, tolerations=(Toleration("gpu", "Exists"),))) is None
    assert why_not_hosted(t, with_(p, tolerations=(Toleration("", "Exists"),))) is None  # tolerates all
    assert (
        why_not_hosted(t, with_(p, tolerations=(Toleration("gpu", "Exists", effect="NoExecute"),)))
        is not None
    )


def test_node_selector_and_required_affinity_against_template_labels() -> None:
    t = Template(WHOLE.resources, labels=MappingProxyType({"pool": "a", "gpus": "8"}))
    p = gpus("a", 1)
    assert why_not_hosted(t, with_(p, node_selector={"pool": "a"})) is None
    assert why_not_hosted(t, with_(p, node_selector={"pool": "b"})) == "node selector pool=b"

    def term(*reqs: Requirement) -> tuple[NodeSelectorTerm, ...]:
        return (NodeSelectorTerm(reqs),)

    ok = [
        term(Requirement("pool", "In", frozenset({"a", "c"}))),
        term(Requirement("pool", "NotIn", frozenset({"b"}))),
        term(Requirement("gpus", "Gt", frozenset({"4"}))),
        term(Requirement("gpus", "Lt", frozenset({"9"}))),
        term(Requirement("pool", "Exists")),
        term(Requirement("zone", "DoesNotExist")),
        term(Requirement("zone", "Exists")) + term(Requirement("pool", "Exists")),  # OR of terms
    ]
    bad = [
        term(Requirement("pool", "In", frozenset({"b"}))),
        term(Requirement("gpus", "Gt", frozenset({"8"}))),
        term(Requirement("gpus", "Lt", frozenset({"x"}))),
        term(Requirement("zone", "Exists")),
        term(Requirement("pool", "Exists"), Requirement("zone", "Exists")),  # AND within a term
        term(Requirement("pool", "Bogus")),
    ]
    assert all(why_not_hosted(t, with_(p, affinity=a)) is None for a in ok)
    assert all(why_not_hosted(t, with_(p, affinity=a)) == "required node affinity" for a in bad)


def test_size_limits() -> None:
    assert why_not_hosted(WHOLE, gpus("a", 9)) == "asks 9 nvidia.com/gpu, a node has 8"
    mig = with_(gpus("a", 1), requests={"nvidia.com/mig-1g.10gb": 1000})
    assert why_not_hosted(WHOLE, mig) == "asks 1 nvidia.com/mig-1g.10gb, a node has 0"
    mig_template = Template(MappingProxyType({"nvidia.com/mig-1g.10gb": 7000}))
    assert why_not_hosted(mig_template, mig) is None
    assert nodes_needed([with_(mig, name=f"m{i}") for i in range(8)], mig_template) == 2
    # cpu/memory/pods bind only when the template declares them.
    assert why_not_hosted(WHOLE, with_(gpus("a", 1), requests={GPU: 1000, "cpu": 500_000})) is None
    t = Template(MappingProxyType({GPU: 8000, "cpu": 96000}))
    assert why_not_hosted(t, with_(gpus("a", 1), requests={GPU: 1000, "cpu": 500_000})) is not None


def test_shared_gpu_rules_are_per_card() -> None:
    assert why_not_hosted(SHARED, shared_pod("a", 16)) is None
    assert "on one card" in (why_not_hosted(SHARED, shared_pod("a", 17)) or "")
    assert why_not_hosted(SHARED, shared_pod("a", 0, core=100)) is None
    assert why_not_hosted(WHOLE, shared_pod("a", 4)) is not None
    over = with_(shared_pod("a", 1, core=101), requests={MEM: 1000, CORE: 101_000})
    t = Template(MappingProxyType({MEM: 64000, CORE: 101_000}), shared=SharedCards(1, 64000))
    assert "cores" in (why_not_hosted(t, over) or "")


# -- packing ---------------------------------------------------------------------------------


def test_whole_gpus_pack_per_node() -> None:
    assert nodes_needed([gpus(f"p{i}", 2) for i in range(5)], WHOLE) == 2
    assert nodes_needed([gpus(f"p{i}", 8) for i in range(3)], WHOLE) == 3
    assert nodes_needed([gpus("a", 5), gpus("b", 5), gpus("c", 3), gpus("d", 3)], WHOLE) == 2  # FFD
    assert nodes_needed([gpus("big", 9)], WHOLE) == 0  # no node can host it: not demand here


def test_gpushare_memory_packs_per_card_not_per_node() -> None:
    # 12 x 5 GiB on 4 x 16 GiB cards: 3 per card, one node.
    assert nodes_needed([shared_pod(f"p{i}", 5) for i in range(12)], SHARED) == 1
    # 10 x 9 GiB: 90 GiB would fit 2 nodes of 64 GiB by sums; one per card makes it 3.
    assert nodes_needed([shared_pod(f"p{i}", 9) for i in range(10)], SHARED) == 3


def test_cgpu_core_percentage_is_at_most_100_per_card() -> None:
    # Memory fits 16 per node, cores only 3 x 30 % per card: 12 per node.
    assert nodes_needed([shared_pod(f"p{i}", 1, core=30) for i in range(13)], SHARED) == 2


def test_gpushare_picks_the_fullest_card_that_fits() -> None:
    packer = Packer(SHARED, 1)
    for name, mem in (("a", 10), ("b", 10), ("c", 6), ("d", 6)):
        assert packer.place(shared_pod(name, mem), may_open=False) == 0
    # binpack: c goes onto a's card (6 left), d onto b's: both 16 GiB cards full, two left empty.
    assert packer.place(shared_pod("e", 16), may_open=False) == 0
    assert packer.place(shared_pod("f", 16), may_open=False) == 0
    assert packer.place(shared_pod("g", 1), may_open=False) is None


def test_packer_fills_arriving_nodes_before_opening_new_ones() -> None:
    packer = Packer(WHOLE, 2)
    assert [packer.place(gpus(f"p{i}", 4), may_open=True) for i in range(5)] == [0, 0, 1, 1, 2]
    assert packer.new_nodes == 1
    assert packer.place(gpus("x", 8), may_open=False) is None
    assert packer.still_empty() == 0
    fresh = Packer(WHOLE, 3)
    fresh.place(gpus("a", 1), may_open=False)
    assert fresh.still_empty() == 2 and fresh.still_empty(0, 1) == 0 and fresh.still_empty(1, 3) == 2


def test_size_is_the_largest_share_of_a_node() -> None:
    assert size(gpus("a", 2), WHOLE) == 0.25
    assert size(shared_pod("a", 8), SHARED) == 0.5  # half a card, an eighth of the node's sum
    assert size(with_(gpus("a", 1), requests={"cpu": 1000}), WHOLE) == 0.0

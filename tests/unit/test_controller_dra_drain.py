"""The partial drain of DRA pods: which pods hold a bad GPU through their ResourceClaims.

The objects are shaped as kube-apiserver 1.36 returns them (resource.k8s.io/v1), read through
the same converters the controller's caches use."""

from __future__ import annotations

from typing import Any

from controller_fakes import gpu_verdict, verdict

from gpumon.controller.core.claims import (
    ClaimView,
    SliceView,
    claim_from_json,
    holds_by_pod,
    placed_devices,
    slice_from_json,
)
from gpumon.controller.core.drain_plan import DrainPolicy, plan_drain
from gpumon.controller.core.objects import GpuResources, PodView, pod_from_json
from gpumon.controller.core.plans import DrainPlan
from gpumon.controller.core.verdicts import NodeVerdict
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimRef, DeviceRef

DRIVERS = frozenset({NVIDIA_GPU_DRIVER})
NODE = "n1"


def _attrs(**values: str) -> dict[str, Any]:
    return {k: {"string": v} for k, v in values.items()}


def resource_slice(node: str = NODE, generation: int = 1, driver: str = NVIDIA_GPU_DRIVER) -> dict[str, Any]:
    """NVIDIA's kubelet plugin's slice for a node with GPU 0 and GPU 1 whole, and GPU 2 split
    into two 3g.40gb instances (partitionable devices: the parent is listed too)."""
    devices = [
        {"name": f"gpu-{i}", "attributes": _attrs(type="gpu", uuid=f"GPU-{i}", productName="NVIDIA A100")}
        for i in range(3)
    ] + [
        {
            "name": f"gpu-2-mig-9-{start}-4",
            "attributes": _attrs(type="mig", uuid=f"MIG-2-{start}", parentUUID="GPU-2", profile="3g.40gb"),
            "capacity": {"memory": {"value": "40Gi"}},
        }
        for start in (0, 4)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-x2v9q", "resourceVersion": "7"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(
    name: str, *devices: str, pods: tuple[str, ...] = (), driver: str = NVIDIA_GPU_DRIVER
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if devices:
        results = [{"request": "gpu", "driver": driver, "pool": NODE, "device": d} for d in devices]
        status["allocation"] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": f"cuid-{name}", "resourceVersion": "9"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]
            }
        },
        "status": status,
    }


def dra_pod(name: str, claim_name: str | None = None, template: str | None = None) -> PodView:
    """A pod asking for a GPU through a claim by name, or through a template (whose claim the
    resourceclaim controller made and recorded in the pod's status)."""
    entry: dict[str, Any] = {"name": "gpu"}
    statuses = []
    if claim_name is not None:
        entry["resourceClaimName"] = claim_name
    if template is not None:
        entry["resourceClaimTemplateName"] = "one-gpu"
        statuses.append({"name": "gpu", "resourceClaimName": template})
    raw = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [entry],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": statuses},
    }
    return pod_from_json(raw, GpuResources())


def templated(*names: str) -> list[PodView]:
    """Pods each given claim ``<name>-c`` from a template."""
    return [dra_pod(n, template=f"{n}-c") for n in names]


def claims_cache(*objs: dict[str, Any]) -> dict[str, ClaimView]:
    out = {}
    for obj in objs:
        view = claim_from_json(obj, DRIVERS)
        if view is not None:
            out[str(view.ref)] = view
    return out


def slices(*objs: dict[str, Any]) -> list[SliceView]:
    return [v for o in objs if (v := slice_from_json(o, DRIVERS)) is not None]


def plan(
    pods: list[PodView], claims: dict[str, ClaimView], bad: int = 1, v: NodeVerdict | None = None
) -> DrainPlan:
    """The drain of node n1 with GPU ``bad`` unhealthy (or verdict ``v``), its pods placed by
    the node's slice."""
    holds = holds_by_pod(pods, claims, slices(resource_slice()))
    v = v or verdict(gpu_verdict(bad))
    return plan_drain(v, None, pods, (), now=10.0, started_at=0.0, policy=DrainPolicy(), holds=holds)


def drain(
    pods: list[PodView], claims: dict[str, ClaimView], bad: int = 1, v: NodeVerdict | None = None
) -> list[str]:
    return [t.pod.name for t in plan(pods, claims, bad, v).targets]


def test_the_pod_whose_claim_holds_the_bad_gpu_goes_and_no_other() -> None:
    pods = templated("a", "b", "c")
    claims = claims_cache(
        claim("a-c", "gpu-0", pods=("a",)),
        claim("b-c", "gpu-1", pods=("b",)),
        claim("c-c", "gpu-2-mig-9-0-4", pods=("c",)),
    )
    p = plan(pods, claims)
    assert p.partial and [t.pod.name for t in p.targets] == ["b"]
    assert p.targets[0].why == "uses GPU 1 (GPU-1) through DRA device gpu-1 of claim b-c"


def test_a_bad_gpu_takes_the_pods_on_its_mig_devices() -> None:
    pods = templated("a", "m0", "m4")
    claims = claims_cache(
        claim("a-c", "gpu-0", pods=("a",)),
        claim("m0-c", "gpu-2-mig-9-0-4", pods=("m0",)),
        claim("m4-c", "gpu-2-mig-9-4-4", pods=("m4",)),
    )
    assert drain(pods, claims, bad=2) == ["m0", "m4"]
    why = plan(pods, claims, bad=2).targets[0].why
    assert why == "uses GPU 2 (GPU-2) through DRA device gpu-2-mig-9-0-4 (MIG-2-0) of claim m0-c"


def test_a_claim_shared_by_several_pods_evicts_every_holder() -> None:
    pods = [
        dra_pod("s1", claim_name="shared"),
        dra_pod("s2", claim_name="shared"),
        dra_pod("o", template="o-c"),
    ]
    claims = claims_cache(claim("shared", "gpu-1", pods=("s1", "s2")), claim("o-c", "gpu-0", pods=("o",)))
    assert drain(pods, claims) == ["s1", "s2"]


def test_a_device_no_slice_describes_is_unplaced_and_goes() -> None:
    # gpu-7 is in no slice (the driver has not published it, or the slice is gone): the pod
    # might be on the bad GPU, like any GPU pod nothing places.
    pods = templated("a", "x")
    claims = claims_cache(claim("a-c", "gpu-0", pods=("a",)), claim("x-c", "gpu-7", pods=("x",)))
    assert drain(pods, claims) == ["x"]


def test_claims_of_other_drivers_and_unallocated_claims_make_no_gpu_pod() -> None:
    pods = templated("nic", "wait", "a")
    claims = claims_cache(
        claim("nic-c", "eth-0", driver="net.example.com"),
        claim("wait-c"),
        claim("a-c", "gpu-1", pods=("a",)),
    )
    assert set(claims) == {"ml/a-c"}, "only GPU allocations are cached"
    assert drain(pods, claims) == ["a"]
    # A node-scoped finding drains every GPU pod: DRA ones included, the NIC pod not.
    whole = verdict(gpu_verdict(1), node_findings=gpu_verdict(1).findings)
    assert drain(pods, claims, v=whole) == ["a"]


def test_whole_node_drain_without_placement_takes_dra_pods() -> None:
    # No slice at all: nothing places the DRA pod, the extended-resource pod is not placed
    # either, so every GPU pod goes.
    pods = [dra_pod("a", template="a-c")]
    claims = claims_cache(claim("a-c", "gpu-1", pods=("a",)))
    holds = holds_by_pod(pods, claims, [])
    p = plan_drain(
        verdict(gpu_verdict(1)), None, pods, (), now=1.0, started_at=0.0, policy=DrainPolicy(), holds=holds
    )
    assert not p.partial and [t.pod.name for t in p.targets] == ["a"]


def test_claim_view_keeps_the_gpu_devices_and_the_pods_reserved() -> None:
    view = claim_from_json(claim("c", "gpu-1", "gpu-1", pods=("p", "q")), DRIVERS)
    assert view == ClaimView(ClaimRef("ml", "c"), (DeviceRef(NVIDIA_GPU_DRIVER, NODE, "gpu-1"),), ("p", "q"))
    assert claim_from_json(claim("c", "gpu-1"), frozenset({"other.example.com"})) is None


def test_the_newest_generation_of_a_pool_places_its_devices() -> None:
    old, new = resource_slice(generation=1), resource_slice(generation=2)
    new["spec"]["devices"][1]["attributes"]["uuid"] = {"string": "GPU-1-replaced"}
    old["spec"]["devices"].append({"name": "gpu-9", "attributes": _attrs(type="gpu", uuid="GPU-9")})
    placed = placed_devices(slices(new, old))
    assert placed[DeviceRef(NVIDIA_GPU_DRIVER, NODE, "gpu-1")].card_uuid == "GPU-1-replaced"
    assert placed[DeviceRef(NVIDIA_GPU_DRIVER, NODE, "gpu-2-mig-9-4-4")].card_uuid == "GPU-2"
    # A device the newer generation no longer publishes is gone, not kept from the old one.
    assert DeviceRef(NVIDIA_GPU_DRIVER, NODE, "gpu-9") not in placed
    assert slice_from_json(resource_slice(driver="net.example.com"), DRIVERS) is None


def test_pod_from_json_reads_its_claims() -> None:
    assert dra_pod("a", template="a-gpu-x").claims == (ClaimRef("ml", "a-gpu-x"),)
    assert dra_pod("s", claim_name="shared").claims == (ClaimRef("ml", "shared"),)
    assert not dra_pod("a", template="x").uses_gpu, "no extended resource: only its claims say"

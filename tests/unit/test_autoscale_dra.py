"""DRA demand: pending pods' ResourceClaims allocated on the devices a pool's template publishes
(gpumon.controller.core.device_claims, gpumon.controller.core.demand), CEL selectors through
gpumon.k8s.dra_cel, and what the planner makes of them. API objects are shaped as resource.k8s.io/v1
answers them (defaults filled in by the API server: allocationMode, count)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from test_autoscale_planner import NOW, make_pool, plan1, scale
from test_autoscale_properties import PROPERTY

from gpumon.config.pools import PoolConfig
from gpumon.controller.core.demand import PodDemand, pending_gpu_pod, refusal, why_not_hosted, with_claims
from gpumon.controller.core.device_claims import (
    ClaimRequests,
    DeviceClassView,
    claim_requests,
    device_class_view,
)
from gpumon.controller.core.objects import GpuResources
from gpumon.controller.core.scale_plan import Action
from gpumon.k8s.dra import DeviceRef, SliceDevice
from gpumon.k8s.dra_cel import SelectorError, compile_selector
from gpumon.k8s.resources import GPU_RESOURCE_NAMES, GPU_RESOURCE_PREFIXES

NS = "ml"
GIB = 2**30
# NVIDIA's chart's DeviceClasses (k8s-dra-driver-gpu, deployments/helm: deviceclass-gpu/-mig).
GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
RESOURCES = GpuResources(frozenset(GPU_RESOURCE_NAMES), GPU_RESOURCE_PREFIXES)


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


CLASSES = {
    name: device_class_view(device_class(name, expr), compile_selector)
    for name, expr in (("gpu.nvidia.com", GPU_CLASS), ("mig.nvidia.com", MIG_CLASS))
}


def claim(
    name: str,
    *,
    device_class_name: str = "gpu.nvidia.com",
    count: int = 1,
    mode: str = "ExactCount",
    selectors: tuple[str, ...] = (),
    allocated: bool = False,
    **exactly: Any,
) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": device_class_name, "allocationMode": mode, **exactly}
    if mode == "ExactCount":
        request["count"] = count
    if selectors:
        request["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-claim-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        "status": {},
    }
    if allocated:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n0", "device": "gpu-0"}
                    ]
                }
            }
        }
    return obj


def pod_obj(name: str, claim_name: str, *, template: bool = True) -> dict[str, Any]:
    """A pending pod whose claim comes from a ResourceClaimTemplate (created by the resourceclaim
    controller and named in status) or is named directly."""
    entry: dict[str, Any] = (
        {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}
        if template
        else {"name": "gpu", "resourceClaimName": claim_name}
    )
    status: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 cannot allocate all claims.",
                "lastTransitionTime": "2026-11-24T08:00:00Z",
            }
        ],
    }
    if template:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "cuda", "image": "cuda:12", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [entry],
        },
        "status": status,
    }


def demand(
    pods: int,
    claim_for: Any = None,
    *,
    classes: Mapping[str, DeviceClassView] = CLASSES,
    shared: bool = False,
) -> list[PodDemand]:
    """``pods`` pending pods, each with its own claim (``claim_for(i)``) or one shared claim."""
    claim_for = claim_for or (lambda i: claim(f"c{i}"))
    claims: dict[str, ClaimRequests] = {}
    out = []
    for i in range(pods):
        obj = claim_for(0 if shared else i)
        view = claim_requests(obj, compile_selector)
        claims[view.key] = view
        pod = pending_gpu_pod(
            pod_obj(f"p{i}", obj["metadata"]["name"], template=not shared), RESOURCES, lambda _: NOW
        )
        assert pod is not None
        resolved = with_claims(pod, claims, classes)
        assert resolved is not None
        out.append(resolved)
    return out


def gpus(count: int = 8, product: str = "NVIDIA A100-SXM4-80GB", memory: str = "80Gi") -> dict[str, Any]:
    return {
        "name": "gpu",
        "count": count,
        "attributes": {"type": "gpu", "productName": product},
        "capacity": {"memory": memory},
    }


def migs(profile: str, count: int, memory: str) -> dict[str, Any]:
    return {
        "name": f"mig-{profile.replace('.', '-')}",
        "count": count,
        "attributes": {"type": "mig", "profile": profile, "productName": "NVIDIA A100-SXM4-80GB"},
        "capacity": {"memory": memory},
    }


def dra_pool(*devices: dict[str, Any], name: str = "a", driver: str = "gpu.nvidia.com", **over: Any) -> Any:
    dra = {"driver": driver, "devices": list(devices) or [gpus()]}
    return make_pool(name, template={"dra": dra}, **over)


def device(**attributes: Any) -> SliceDevice:
    capacity = {"gpu.nvidia.com/memory": attributes.pop("memory", 80 * GIB)}
    return SliceDevice(
        DeviceRef("gpu.nvidia.com", "n0", "gpu-0"),
        {f"gpu.nvidia.com/{k}": v for k, v in attributes.items()},
        capacity,
    )


# -- CEL ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (GPU_CLASS, True),
        (MIG_CLASS, False),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("81Gi")) >= 0', False),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("80Gi"))', False),
        ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("85899345921"))', True),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")', True),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("80G")', False),
        ('quantity("1.5").add(quantity("500m")) == quantity("2")', True),
        ('quantity("2").sub(1).isInteger() && quantity("500m").sign() == 1', True),
        ('isQuantity("12Gi") && !isQuantity("12 apples")', True),
        ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")', True),
        ('device.attributes["gpu.nvidia.com"].productName.matches("H100")', False),
        # A domain nothing is published in is an empty map (the API's documented behaviour).
        ('size(device.attributes["example.com"]) == 0', True),
        ('"uuid" in device.attributes["gpu.nvidia.com"]', False),
    ],
)
def test_cel_selectors_are_evaluated_as_kubernetes_does(expression: str, expected: bool) -> None:
    dev = device(type="gpu", productName="NVIDIA A100-SXM4-80GB")
    assert compile_selector(expression)(dev) is expected


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ('device.attributes["gpu.nvidia.com"].uuid == "GPU-1"', "no such member"),
        ('semver("550.54.15").isGreaterThan(semver("550.0.0"))', "semver"),
        ('device.attributes["gpu.nvidia.com"].productName.lowerAscii() == "a"', "lowerAscii"),
        ('device.attributes["gpu.nvidia.com"].productName', "not a boolean"),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(1) == 0', "no such overload"),
        ('quantity("12 apples").sign() == 1', "invalid quantity"),
    ],
)
def test_cel_errors_are_errors_not_false(expression: str, error: str) -> None:
    with pytest.raises(SelectorError, match=error):
        compile_selector(expression)(device(type="gpu", productName="NVIDIA A100-SXM4-80GB"))


def test_cel_that_does_not_parse_fails_at_compile() -> None:
    with pytest.raises(SelectorError, match="does not parse"):
        compile_selector('device.driver == "gpu.nvidia.com" &&')


# -- claims -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "kind", "why"),
    [
        (
            lambda r: (
                r.update(firstAvailable=[{"name": "a", "deviceClassName": "gpu.nvidia.com"}])
                or r.pop("exactly")
            ),
            "dra_unsupported",
            "firstAvailable",
        ),
        (lambda r: r["exactly"].update(adminAccess=True), "dra_unsupported", "adminAccess"),
        (
            lambda r: r["exactly"].update(capacity={"requests": {"memory": "10Gi"}}),
            "dra_unsupported",
            "capacity",
        ),
        (lambda r: r["exactly"].update(selectors=[{"other": {}}]), "dra_unsupported", "not CEL"),
        (
            lambda r: r["exactly"].update(selectors=[{"cel": {"expression": "device.("}}]),
            "dra_unevaluable",
            "parse",
        ),
        (
            lambda r: r["exactly"].update(deviceClassName="nope.example.com"),
            "dra_unevaluable",
            "does not exist",
        ),
    ],
)
def test_forms_the_planner_does_not_evaluate_are_refused(change: Any, kind: str, why: str) -> None:
    obj = claim("c0")
    change(obj["spec"]["devices"]["requests"][0])
    (pod,) = demand(1, lambda i: obj)
    refused = refusal(pod)
    assert refused is not None and refused.kind == kind and why in refused.message


def test_constraints_are_refused() -> None:
    obj = claim("c0")
    obj["spec"]["devices"]["constraints"] = [{"matchAttribute": "gpu.nvidia.com/productName"}]
    (pod,) = demand(1, lambda i: obj)
    assert (r := refusal(pod)) is not None and r.kind == "dra_unsupported" and "constraints" in r.message


def test_pods_whose_claims_are_not_there_or_allocated_are_not_demand() -> None:
    pod = pending_gpu_pod(pod_obj("p0", "c0"), RESOURCES, lambda _: NOW)
    assert pod is not None and [str(c) for c in pod.claim_refs] == [f"{NS}/c0"]
    assert with_claims(pod, {}, CLASSES) is None  # not in the cache yet
    allocated = claim_requests(claim("c0", allocated=True), compile_selector)
    assert with_claims(pod, {allocated.key: allocated}, CLASSES) is None
    # The resourceclaim controller has not created the template's claim yet.
    obj = pod_obj("p1", "c1")
    del obj["status"]["resourceClaimStatuses"]
    waiting = pending_gpu_pod(obj, RESOURCES, lambda _: NOW)
    assert waiting is not None and waiting.claims_missing and with_claims(waiting, {}, CLASSES) is None


# -- planning -----------------------------------------------------------------------------------


def test_whole_gpus_ten_pods_of_one_gpu_need_two_eight_gpu_nodes() -> None:
    p = plan1(dra_pool(), scale(0), demand(10))
    assert p.action is Action.SCALE_UP and (p.current, p.desired, p.demand_nodes, p.pending) == (0, 2, 2, 10)


def test_exact_count_and_all() -> None:
    four = demand(5, lambda i: claim(f"c{i}", count=4))
    assert plan1(dra_pool(), scale(0), four).desired == 3  # two 4-GPU pods per 8-GPU node
    every = demand(3, lambda i: claim(f"c{i}", mode="All"))
    assert plan1(dra_pool(), scale(0), every).desired == 3  # each takes a whole node
    # All needs at least one matching device.
    none = ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',)
    nothing = demand(1, lambda i: claim(f"c{i}", mode="All", selectors=none))
    assert why_not_hosted(dra_pool().template, nothing[0]) is not None
    assert plan1(dra_pool(), scale(0), nothing).action is Action.NONE
    too_many = demand(1, lambda i: claim(f"c{i}", count=9))
    p = plan1(dra_pool(), scale(0), too_many)
    assert p.action is Action.NONE and p.pending == 0


def test_mig_profiles_are_devices_of_their_class() -> None:
    pool = dra_pool(migs("1g.10gb", 14, "10Gi"), migs("3g.40gb", 4, "40Gi"))
    small = demand(
        20,
        lambda i: claim(
            f"s{i}",
            device_class_name="mig.nvidia.com",
            selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',),
        ),
    )
    assert plan1(pool, scale(0), small).desired == 2  # 14 per node
    big = demand(
        9,
        lambda i: claim(
            f"b{i}",
            device_class_name="mig.nvidia.com",
            selectors=('device.attributes["gpu.nvidia.com"].profile == "3g.40gb"',),
        ),
    )
    assert plan1(pool, scale(0), big).desired == 3  # 4 per node
    # Whole GPUs are not in a MIG-only template.
    assert plan1(pool, scale(0), demand(1)).action is Action.NONE


def test_a_gpu_and_the_mig_devices_carved_from_it_exclude_each_other() -> None:
    card = {"name": "gpu-0", "attributes": {"type": "gpu", "uuid": "GPU-0"}, "capacity": {"memory": "80Gi"}}
    parts = [
        {"name": f"gpu-0-mig-{i}", "attributes": {"type": "mig", "parentUUID": "GPU-0", "profile": "3g.40gb"}}
        for i in range(2)
    ]
    pool = dra_pool(card, *parts)
    mig = demand(1, lambda i: claim("m", device_class_name="mig.nvidia.com"))
    whole = demand(1, lambda i: claim("g"))
    both = [replace(mig[0], uid="uid-m", name="m"), replace(whole[0], uid="uid-g", name="g")]
    assert plan1(pool, scale(0), both).desired == 2


def test_selectors_on_what_the_template_publishes() -> None:
    big = ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',)
    h100 = ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',)
    small_pool = dra_pool(gpus(memory="24Gi", product="NVIDIA L4"), name="l4")
    big_pool = dra_pool(gpus(product="NVIDIA H100 80GB HBM3"), name="h100")
    for sel in (big, h100):
        pods = demand(3, lambda i, sel=sel: claim(f"c{i}", selectors=sel))
        assert why_not_hosted(small_pool.template, pods[0]) is not None
        assert why_not_hosted(big_pool.template, pods[0]) is None
        l4, h = plan_two(small_pool, big_pool, pods)
        assert (l4.desired, h.desired) == (0, 1)


def plan_two(a: Any, b: Any, pods: list[PodDemand]) -> tuple[Any, Any]:
    from gpumon.controller.core.scale_plan import PoolInput, plan_pools

    first, second = plan_pools([PoolInput(a, scale(0)), PoolInput(b, scale(0))], pods, NOW)
    return first, second


def test_a_claim_shared_by_pods_is_one_demand() -> None:
    shared = demand(3, lambda i: claim("team", count=8), shared=True)
    p = plan1(dra_pool(), scale(0), shared)
    assert p.desired == 1 and p.pending == 3
    assert p.pods == ("ml/p0", "ml/p1", "ml/p2") and not [n for n in p.notes if n.reason == "GpuPoolAtLimit"]


def test_a_selector_the_template_cannot_answer_is_refused_and_nothing_scaled() -> None:
    no_uuid = ('device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU-")',)
    pods = demand(4, lambda i: claim(f"c{i}", selectors=no_uuid))
    pool = dra_pool()
    p = plan1(pool, scale(0), pods)
    assert p.action is Action.NONE and p.desired == 0 and p.pending == 0
    refused = refusal(pods[0], [pool.template])
    assert refused is not None and refused.kind == "dra_unevaluable" and "uuid" in refused.message
    unknown = demand(
        1,
        lambda i: claim(
            "x", selectors=('device.attributes["gpu.nvidia.com"].productName.lowerAscii() == "a"',)
        ),
    )
    assert plan1(pool, scale(0), unknown).desired == 0
    assert (r := refusal(unknown[0], [pool.template])) is not None and "lowerAscii" in r.message


def test_a_pod_with_claims_the_template_has_no_devices_for() -> None:
    plain = make_pool()  # nvidia.com/gpu only, no dra
    assert why_not_hosted(plain.template, demand(1)[0]) == "asks for DRA devices, the template publishes none"


# -- config -------------------------------------------------------------------------------------


def test_dra_template_config_becomes_slice_devices() -> None:
    pool = dra_pool(gpus(2), migs("1g.10gb", 1, "10Gi"))
    assert pool.template.dra is not None
    devs = pool.template.dra.devices
    assert [d.ref.device for d in devs] == ["gpu-0", "gpu-1", "mig-1g-10gb"]
    assert devs[0].attributes == {
        "gpu.nvidia.com/type": "gpu",
        "gpu.nvidia.com/productName": "NVIDIA A100-SXM4-80GB",
    }
    assert devs[0].capacity == {"gpu.nvidia.com/memory": 80 * GIB} and devs[2].kind == "mig"


@pytest.mark.parametrize(
    ("dra", "field", "message"),
    [
        ({"devices": []}, "template.dra.devices", "at least 1"),
        ({"devices": [{"name": "GPU_0"}]}, "template.dra.devices.0.name", "pattern"),
        (
            {"devices": [{"name": "g", "capacity": {"memory": "lots"}}]},
            "template.dra.devices.0.capacity",
            "whole quantity",
        ),
        (
            {"devices": [{"name": "g", "capacity": {"memory": "1.5"}}]},
            "template.dra.devices.0.capacity",
            "whole quantity",
        ),
        (
            {"devices": [{"name": "g", "attributes": {"bad name": "x"}}]},
            "template.dra.devices.0.attributes",
            "attribute name",
        ),
        ({"devices": [{"name": "g", "attributes": {"x": 1.5}}]}, "template.dra.devices.0.attributes.x", ""),
        ({"devices": [{"name": "g", "count": 2}, {"name": "g-1"}]}, "template.dra", "unique"),
    ],
)
def test_bad_dra_template_config_names_the_field(dra: dict[str, Any], field: str, message: str) -> None:
    cfg = {
        "name": "a",
        "target": {"namespace": "capi", "name": "md"},
        "node_selector": "pool=a",
        "template": {"dra": dra},
        "max_replicas": 1,
    }
    with pytest.raises(ValidationError) as err:
        PoolConfig.model_validate(cfg)
    locs = [".".join(str(x) for x in e["loc"]) for e in err.value.errors()]
    assert any(loc.startswith(field) for loc in locs), locs
    assert message in str(err.value)


# -- property: DRA whole GPUs pack as the extended resource does ---------------------------------


@PROPERTY
@given(st.lists(st.integers(1, 8), max_size=15), st.sampled_from([1, 2, 4, 8]))
def test_exact_count_on_identical_gpus_scales_like_nvidia_com_gpu(counts: list[int], per_node: int) -> None:
    """A DRA template of N identical GPUs and pods asking k of them plan exactly like an
    ``nvidia.com/gpu: N`` template and pods asking ``nvidia.com/gpu: k``."""
    from test_autoscale_planner import pods as gpu_pods

    dra = demand(len(counts), lambda i: claim(f"c{i}", count=counts[i]))
    plain = [pod for i, c in enumerate(counts) for pod in gpu_pods(1, c, prefix=f"p{i}-")]
    got = plan1(dra_pool(gpus(per_node), max_replicas=20), scale(0), dra)
    want = plan1(
        make_pool(template={"resources": {"nvidia.com/gpu": per_node}}, max_replicas=20), scale(0), plain
    )
    assert (got.action, got.desired, got.pending) == (want.action, want.desired, want.pending)


# -- the loop: informers in, plans and reports out ------------------------------------------------


async def test_the_loop_resolves_claims_scales_and_reports_refusals() -> None:
    from test_autoscale_actuator import ScaleKube, autoscaler, node

    pool = dra_pool()
    kube = ScaleKube(pool)
    a = autoscaler(kube, pool)
    assert a.claims is not None and a.device_classes is not None
    for name, dc in CLASSES.items():
        a.device_classes.update_local(name, dc, "1")
    odd = ('device.attributes["gpu.nvidia.com"].productName.lowerAscii() == "a"',)
    for i in range(10):
        obj = claim(f"c{i}", selectors=odd if i == 9 else ())
        a.claims.update_local(f"{NS}/c{i}", claim_requests(obj, compile_selector), "1")
        pod = pending_gpu_pod(pod_obj(f"p{i}", f"c{i}"), RESOURCES, lambda _: NOW)
        assert pod is not None
        a.pending.update_local(f"{NS}/p{i}", pod, "1")
    (plan,) = await a.round()
    assert plan.desired == 2 and kube.scale_patches() == [2] and plan.pending == 9
    (event,) = kube.events("GpuRequestRefused")
    assert event["involvedObject"]["name"] == "p9" and "lowerAscii" in event["message"]
    assert a.metrics.refused_pods.labels("dra_unevaluable")._value.get() == 1
    # A node running a pod that holds a claim is not idle (never scaled down from under it).
    node(a, "n0")
    job = pod_obj("job", "c0")
    job["spec"]["nodeName"] = "n0"
    kube.add(f"/api/v1/namespaces/{NS}/pods/job", job)
    assert await a.busy_nodes() == {"n0"}


def test_without_dra_templates_claims_are_not_watched() -> None:
    from test_autoscale_actuator import ScaleKube, autoscaler

    a = autoscaler(ScaleKube(make_pool()), make_pool())
    assert a.claims is None and a.device_classes is None and len(a.views) == 2


async def test_a_dra_node_has_its_gpus_once_its_slice_is_published() -> None:
    """Joined without a ResourceSlice of the template's driver, a node is arriving capacity (its
    driver is starting), as a device-plugin node is until its GPUs are allocatable."""
    from test_autoscale_actuator import NOW as actuator_now
    from test_autoscale_actuator import ScaleKube, autoscaler, node

    from gpumon.controller.core.claims import PlacedDevice, SliceView
    from gpumon.controller.shell.autoscaler_loop import gpu_resources
    from gpumon.kube.informer import Informer, Selection, View

    pool = dra_pool(driver="example.com")
    assert "example.com" in gpu_resources(RESOURCES, [pool]).drivers
    kube = ScaleKube(pool, replicas=1)
    a = autoscaler(kube, pool)
    slices: View[SliceView] = Informer(Selection("/slices")).view(
        lambda o: None, name="slices", index=lambda s: s.node
    )
    a._slices = slices
    node(a, "n0", created_at=actuator_now - 5)
    (plan,) = await a.round()
    assert plan.arriving == 1
    other = PlacedDevice(DeviceRef("gpu.nvidia.com", "n0", "gpu-0"), None, None)
    slices.update_local("s-other", SliceView("n0", 1, (other,)), "1")
    (plan,) = await a.round()
    assert plan.arriving == 1  # another driver's slice says nothing of this one's devices
    mine = PlacedDevice(DeviceRef("example.com", "n0", "gpu-0"), None, None)
    slices.update_local("s-mine", SliceView("n0", 1, (mine,)), "1")
    (plan,) = await a.round()
    assert plan.arriving == 0


@pytest.mark.parametrize("mig", [{}, {"3g.40gb": 2}])
def test_the_local_drivers_slice_as_a_pool_template(mig: dict[str, int]) -> None:
    """A pool template made from the test driver's slice (gpumon.devcluster.resourceslices)
    declares the devices a node of it publishes, with their attributes and capacities but not
    their UUIDs nor versions."""
    from gpumon.devcluster import nodes, resourceslices
    from gpumon.k8s.dra import slice_devices

    template = nodes.NodeTemplate(gpus=2, dra=True, mig=mig)
    pool = make_pool(template={"dra": resourceslices.pool_dra(template)})
    assert pool.template.dra is not None
    declared = {d.ref.device: d for d in pool.template.dra.devices}
    published = slice_devices(resourceslices.slice_manifest("n0", "uid-n0", template))
    assert sorted(declared) == sorted(d.ref.device for d in published) and len(declared) == (4 if mig else 2)
    for d in published:
        mine = declared[d.ref.device]
        assert mine.uuid is None and mine.kind == d.kind and mine.capacity == d.capacity
        assert all(d.attributes[k] == v for k, v in mine.attributes.items())
        assert (
            "gpu.nvidia.com/driverVersion" in d.attributes
            and "gpu.nvidia.com/driverVersion" not in mine.attributes
        )

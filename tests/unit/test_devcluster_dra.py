"""The local control plane's stand-in for NVIDIA's DRA driver (gpumon.devcluster.resourceslices)
and the kubelet's DRA view in the pod-resources fixture: devices named and attributed as the
driver does, the same UUIDs a simulated exporter on the node reports, and each container served
exactly the devices its claims were allocated."""

from __future__ import annotations

from typing import Any

import pytest

from gpumon.devcluster import nodes, podresources_server, resourceslices
from gpumon.k8s import dra

A100 = nodes.NodeTemplate(gpus=2, dra=True)
MIG = nodes.NodeTemplate(gpus=1, dra=True, mig={"1g.10gb": 2, "3g.40gb": 1})


def _devices(node: str, template: nodes.NodeTemplate) -> tuple[dra.SliceDevice, ...]:
    return dra.slice_devices(resourceslices.slice_manifest(node, "uid-1", template))


def test_whole_gpus_are_named_and_attributed_like_nvidias_driver() -> None:
    devices = _devices("node-a", A100)
    backend = resourceslices.simulated_backend("node-a", A100)
    backend.open()
    uuids = [g.uuid for g in backend.devices()]
    assert [d.ref for d in devices] == [dra.DeviceRef("gpu.nvidia.com", "node-a", f"gpu-{i}") for i in (0, 1)]
    assert [d.uuid for d in devices] == uuids  # what an exporter on the node reports
    d = devices[0]
    assert (d.kind, d.card_uuid, d.parent_uuid, d.profile) == ("gpu", uuids[0], None, None)
    assert d.attribute("productName") == "NVIDIA A100-SXM4-80GB"
    assert d.attribute("architecture") == "Ampere"
    assert d.attribute("cudaComputeCapability") == "8.0.0"
    assert d.attribute("driverVersion") == "550.127.5"  # semver, as the driver writes versions
    assert d.attributes["resource.kubernetes.io/pciBusID"] == "0000:07:00.0"
    assert d.capacity == {"gpu.nvidia.com/memory": 81920 * 2**20}


def test_every_node_has_its_own_gpu_uuids() -> None:
    assert {d.uuid for d in _devices("node-a", A100)}.isdisjoint({d.uuid for d in _devices("node-b", A100)})


def test_a_gpu_in_mig_mode_publishes_only_its_mig_devices() -> None:
    devices = _devices("node-m", MIG)
    backend = resourceslices.simulated_backend("node-m", MIG)
    backend.open()
    [gpu] = backend.devices()
    instances = backend.read_slow(0).mig_instances
    # Widest placement first, each at the lowest start its profile allows (v25.12.0's names).
    assert [d.ref.device for d in devices] == [
        "gpu-0-mig-3g40gb-9-0",
        "gpu-0-mig-1g10gb-19-4",
        "gpu-0-mig-1g10gb-19-5",
    ]
    assert [d.uuid for d in devices] == [m.uuid for m in instances]
    assert {(d.kind, d.parent_uuid, d.card_uuid) for d in devices} == {("mig", gpu.uuid, gpu.uuid)}
    assert [d.profile for d in devices] == ["3g.40gb", "1g.10gb", "1g.10gb"]
    big = devices[0].capacity
    assert big["gpu.nvidia.com/multiprocessors"] == 42
    assert big["gpu.nvidia.com/memory"] == 40192 * 2**20
    assert sorted(k for k in big if "memorySlice" in k) == [
        f"gpu.nvidia.com/memorySlice{i}" for i in range(4)
    ]
    assert "gpu.nvidia.com/memorySlice4" in devices[1].capacity


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (nodes.NodeTemplate(gpus=1, dra=True, mig={"3g.40gb": 2, "1g.10gb": 1}), "do not fit"),
        (nodes.NodeTemplate(gpus=1, dra=True, mig={"2g.10gb": 1}), "no MIG profile 2g.10gb"),
        (nodes.NodeTemplate(gpus=1, dra=True, product="Tesla-V100"), "no DRA device description"),
    ],
)
def test_impossible_layouts_are_refused(template: nodes.NodeTemplate, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resourceslices.devices("n", template)


def test_the_slice_is_the_nodes_one_pool_and_owned_by_the_node() -> None:
    body = resourceslices.slice_manifest("node-a", "uid-1", A100, labels={"pool": "p"})
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["spec"]["nodeName"] == "node-a" and body["spec"]["driver"] == "gpu.nvidia.com"
    assert body["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", "node-a", "uid-1")
    assert body["metadata"]["labels"] == {"pool": "p"}


def test_device_classes_are_nvidias() -> None:
    gpu, mig = resourceslices.device_classes()
    assert gpu["metadata"]["name"] == "gpu.nvidia.com" and mig["metadata"]["name"] == "mig.nvidia.com"
    assert (
        gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu" and "extendedResourceName" not in mig["spec"]
    )
    expression = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    assert mig["spec"]["selectors"] == [{"cel": {"expression": expression}}]


def test_a_dra_node_offers_no_device_plugin_resource() -> None:
    body = nodes.manifest("n", A100)
    assert set(body["status"]["allocatable"]) == {"cpu", "memory", "pods"}
    assert body["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
    assert nodes.pool_template(A100)["resources"] == {"cpu": "96", "memory": "1Ti", "pods": "110"}
    with pytest.raises(ValueError, match="DRA devices need whole GPUs"):
        nodes.NodeTemplate(gpus=0, dra=True)


def _claim(name: str, uid: str, *results: dict[str, Any]) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": list(results)}}} if results else {}
    return {"metadata": {"namespace": "ml", "name": name, "uid": uid}, "status": status}


def _result(request: str, device: str, share: str | None = None) -> dict[str, Any]:
    r = {"request": request, "driver": "gpu.nvidia.com", "pool": "node-a", "device": device}
    return r | ({"shareID": share} if share else {})


def test_each_container_is_served_the_devices_of_the_claims_it_uses() -> None:
    pod = {
        "metadata": {"namespace": "ml", "name": "train-0"},
        "spec": {
            "resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": "two"},
                {"name": "shared", "resourceClaimName": "team"},
                {"name": "later", "resourceClaimName": "unallocated"},
            ],
            "containers": [
                {
                    "name": "main",
                    "resources": {"claims": [{"name": "gpus", "request": "big"}, {"name": "shared"}]},
                },
                {
                    "name": "side",
                    "resources": {"claims": [{"name": "gpus", "request": "small"}, {"name": "later"}]},
                },
                {"name": "plain"},
            ],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train-0-gpus-x"}]},
    }
    claims = {
        dra.ClaimRef("ml", "train-0-gpus-x"): _claim(
            "train-0-gpus-x", "u1", _result("big", "gpu-0"), _result("small/any", "gpu-1-mig-1g10gb-19-0")
        ),
        dra.ClaimRef("ml", "team"): _claim("team", "u2", _result("gpu", "gpu-1", share="s-7")),
        dra.ClaimRef("ml", "unallocated"): _claim("unallocated", "u3"),
    }
    served = podresources_server.dynamic_resources(pod, claims)
    assert set(served) == {"main", "side"}
    main = {
        (d.claim_name, r.device_name, r.share_id if r.HasField("share_id") else None, r.cdi_devices[0].name)
        for d in served["main"]
        for r in d.claim_resources
    }
    assert main == {
        ("train-0-gpus-x", "gpu-0", None, "k8s.gpu.nvidia.com/claim=u1-gpu-0"),
        ("team", "gpu-1", "s-7", "k8s.gpu.nvidia.com/claim=u2-gpu-1"),
    }
    [side] = served["side"]  # the firstAvailable subrequest belongs to its request; "later" is not ready
    assert [r.device_name for r in side.claim_resources] == ["gpu-1-mig-1g10gb-19-0"]
    assert (side.claim_namespace, side.claim_name) == ("ml", "train-0-gpus-x")

    # A pod using both mechanisms: device-plugin devices and DRA devices side by side.
    both = podresources_server.pod_resources("ml", "train-0", {"main": {"nvidia.com/gpu": ["3"]}}, served)
    by_name = {c.name: c for c in both.containers}
    assert [c.name for c in both.containers] == ["main", "side"]
    assert [d.device_ids for d in by_name["main"].devices] == [["3"]]
    assert len(by_name["main"].dynamic_resources) == 2 and not by_name["side"].devices


def test_a_plain_gpu_request_backed_by_dra_is_served_from_the_schedulers_claim() -> None:
    # DRAExtendedResource: the pod asked nvidia.com/gpu, the node has only DRA devices; the
    # scheduler made a claim for it and says which container's resource maps to which request.
    pod = {
        "metadata": {"namespace": "ml", "name": "legacy"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {
            "extendedResourceClaimStatus": {
                "resourceClaimName": "legacy-extended-resources-x",
                "requestMappings": [
                    {
                        "containerName": "main",
                        "resourceName": "nvidia.com/gpu",
                        "requestName": "container-0-request-0",
                    }
                ],
            }
        },
    }
    claim = _claim("legacy-extended-resources-x", "u9", _result("container-0-request-0", "gpu-0"))
    served = podresources_server.dynamic_resources(
        pod, {dra.ClaimRef("ml", "legacy-extended-resources-x"): claim}
    )
    [dynamic] = served["main"]
    assert dynamic.claim_name == "legacy-extended-resources-x"
    assert [r.device_name for r in dynamic.claim_resources] == ["gpu-0"]

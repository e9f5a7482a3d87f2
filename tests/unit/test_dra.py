"""DRA objects read as the API server sends them (resource.k8s.io/v1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpumon.k8s.dra import (
    GPU_TYPE,
    MIG_TYPE,
    NVIDIA_GPU_DRIVER,
    AllocatedDevice,
    ClaimRef,
    DeviceRef,
    claim_devices,
    newest_generation,
    pod_claims,
    pod_claims_by_entry,
    resource_claims_path,
    slice_devices,
)

GPU_UUID = "GPU-7c1f2a9e-0d3b-4c5a-8e6f-1a2b3c4d5e6f"
MIG_UUID = "MIG-1d2e3f40-5a6b-4c7d-8e9f-a0b1c2d3e4f5"


def _slice(
    devices: list[Any], *, driver: str = NVIDIA_GPU_DRIVER, pool: str = "gpu-node-1"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-{driver}-x7k2p"},
        "spec": {
            "driver": driver,
            "nodeName": pool,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


WHOLE_GPU = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "uuid": {"string": GPU_UUID},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "driverVersion": {"version": "550.127.8"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "index": {"int": 0},
        "cliqueID": {"bool": False},
    },
    "capacity": {"memory": {"value": "80Gi"}},
}
MIG_DEVICE = {
    "name": "gpu-0-mig-9-4-4",
    "attributes": {
        "type": {"string": "mig"},
        "uuid": {"string": MIG_UUID},
        "parentUUID": {"string": GPU_UUID},
        "profile": {"string": "3g.40gb"},
    },
    "capacity": {"memory": {"value": "40320Mi"}, "multiprocessors": {"value": "42"}},
}


def test_whole_gpu_and_mig_device_name_their_card() -> None:
    gpu, mig = slice_devices(_slice([WHOLE_GPU, MIG_DEVICE]))

    assert gpu.ref == DeviceRef(NVIDIA_GPU_DRIVER, "gpu-node-1", "gpu-0")
    assert (gpu.kind, gpu.uuid, gpu.card_uuid, gpu.parent_uuid) == (GPU_TYPE, GPU_UUID, GPU_UUID, None)
    assert gpu.capacity["gpu.nvidia.com/memory"] == 80 << 30
    assert gpu.attribute("productName") == "NVIDIA A100-SXM4-80GB"
    assert gpu.attributes["gpu.nvidia.com/driverVersion"] == "550.127.8"
    assert gpu.attributes["gpu.nvidia.com/index"] == 0
    assert gpu.attributes["gpu.nvidia.com/cliqueID"] is False
    # A qualified name stays in its own domain.
    assert gpu.attribute("resource.kubernetes.io/pcieRoot") == "pci0000:00"

    assert (mig.kind, mig.uuid, mig.card_uuid, mig.profile) == (MIG_TYPE, MIG_UUID, GPU_UUID, "3g.40gb")
    assert mig.capacity == {"gpu.nvidia.com/memory": 40320 << 20, "gpu.nvidia.com/multiprocessors": 42}


def test_a_malformed_device_hides_none_of_the_others() -> None:
    bad = [
        "gpu-9",
        {"attributes": {}},
        {
            "name": "gpu-1",
            "attributes": {"uuid": {"int": "not a number"}, "type": "gpu"},
            "capacity": {"memory": {}},
        },
    ]
    devices = slice_devices(_slice([*bad, WHOLE_GPU]))

    assert [d.ref.device for d in devices] == ["gpu-1", "gpu-0"]
    assert (devices[0].uuid, devices[0].kind, devices[0].card_uuid, devices[0].capacity) == (
        None,
        None,
        None,
        {},
    )
    assert slice_devices({"spec": {"driver": NVIDIA_GPU_DRIVER, "devices": [WHOLE_GPU]}}) == ()
    assert slice_devices({}) == ()


def test_claim_devices_read_the_allocation_results() -> None:
    claim = {
        "metadata": {"namespace": "ml", "name": "train-0-gpu-abcde"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "pool": "n1", "device": "gpu-0"},
                        {
                            "request": "gpu",
                            "driver": NVIDIA_GPU_DRIVER,
                            "pool": "n1",
                            "device": "gpu-1",
                            "shareID": "8d1a",
                        },
                        {"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "device": "gpu-2"},
                    ]
                },
                "nodeSelector": {"nodeSelectorTerms": []},
            },
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "u1"}],
        },
    }

    assert claim_devices(claim) == (
        AllocatedDevice(DeviceRef(NVIDIA_GPU_DRIVER, "n1", "gpu-0"), "gpu"),
        AllocatedDevice(DeviceRef(NVIDIA_GPU_DRIVER, "n1", "gpu-1"), "gpu", "8d1a"),
    )
    assert claim_devices({"status": {}}) == ()
    assert claim_devices({}) == ()


def test_pod_claims_named_directly_or_through_a_template() -> None:
    pod = {
        "metadata": {"namespace": "ml", "name": "train-0"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                {"name": "shared", "resourceClaimName": "team-gpus"},
                {"name": "pending", "resourceClaimTemplateName": "one-gpu"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-0-gpu-abcde"}]},
    }

    # The template's claim not created yet ("pending") has no name to give.
    assert pod_claims(pod) == (ClaimRef("ml", "train-0-gpu-abcde"), ClaimRef("ml", "team-gpus"))
    assert pod_claims({"metadata": {"namespace": "ml"}, "spec": {}}) == ()
    # What a container's resources.claims[].name refers to.
    assert pod_claims_by_entry(pod) == {
        "gpu": ClaimRef("ml", "train-0-gpu-abcde"),
        "shared": ClaimRef("ml", "team-gpus"),
    }


def test_pod_claims_include_the_claim_backing_extended_resources() -> None:
    # kube-scheduler 1.36 (DRAExtendedResource) allocates a pod's nvidia.com/gpu through a claim
    # it creates, where a DeviceClass names that extendedResourceName and no device plugin does.
    mapping = {
        "containerName": "cuda",
        "resourceName": "nvidia.com/gpu",
        "requestName": "container-0-request-0",
    }
    pod = {
        "metadata": {"namespace": "ml", "name": "train-0"},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {
            "extendedResourceClaimStatus": {
                "requestMappings": [mapping],
                "resourceClaimName": "train-0-extended-resources-x8k2d",
            }
        },
    }
    assert pod_claims(pod) == (ClaimRef("ml", "train-0-extended-resources-x8k2d"),)
    assert pod_claims_by_entry(pod) == {}, "no entry of the pod names it"


def test_claim_collection_paths() -> None:
    assert resource_claims_path() == "/apis/resource.k8s.io/v1/resourceclaims"
    assert resource_claims_path("ml") == "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"


@dataclass(frozen=True)
class _Part:
    driver: str
    pool: str
    generation: int
    name: str


def test_only_the_newest_generation_of_each_pool_counts() -> None:
    a1, a2 = _Part("gpu.nvidia.com", "n1", 1, "a1"), _Part("gpu.nvidia.com", "n1", 2, "a2")
    a2b = _Part("gpu.nvidia.com", "n1", 2, "a2b")
    other_driver = _Part("net.example.com", "n1", 1, "net")
    b1 = _Part("gpu.nvidia.com", "n2", 1, "b1")

    assert newest_generation([a1, b1, a2, other_driver, a2b]) == [b1, a2, other_driver, a2b]
    assert newest_generation([]) == []

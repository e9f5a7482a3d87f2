"""Node templates become the Node bodies kwok manages: GPU resources, GPU Operator/NFD labels,
OS, pool labels; and a MachineDeployment body the v1beta2 schema accepts."""

from __future__ import annotations

import pytest

from gpumon.devcluster import capi, nodes


def test_whole_gpu_node_has_resource_labels_and_kwok_annotation() -> None:
    body = nodes.manifest("gpu-a", nodes.NodeTemplate(gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    meta, status = body["metadata"], body["status"]
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert status["capacity"][nodes.GPU] == "8" and status["allocatable"][nodes.GPU] == "8"
    assert {
        "nvidia.com/gpu.present": "true",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": "gpu-a",
    }.items() <= meta["labels"].items()
    assert status["nodeInfo"]["operatingSystem"] == "linux"


def test_shared_gpu_node_advertises_memory_count_and_core_share() -> None:
    template = nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(gpus=2, memory_gib_per_gpu=24))
    status = nodes.manifest("share-a", template)["status"]
    assert {k: status["allocatable"][k] for k in nodes.gpu_resources(template)} == {
        nodes.SHARED_GPU_MEMORY: "48",
        nodes.SHARED_GPU_COUNT: "2",
        nodes.SHARED_GPU_CORE: "200",
    }
    assert nodes.GPU not in status["allocatable"]
    assert nodes.labels("share-a", template)["nvidia.com/gpu.count"] == "2"


def test_windows_and_cpu_only_nodes() -> None:
    win = nodes.manifest("win-a", nodes.NodeTemplate(gpus=2, os="windows"))
    assert win["metadata"]["labels"]["kubernetes.io/os"] == "windows"
    # Alibaba's DirectX device plugin offers the GPUs; NVIDIA's plugin does not run on Windows.
    assert win["status"]["allocatable"]["windows.alibabacloud.com/directx"] == "2"
    assert nodes.GPU not in win["status"]["allocatable"]
    assert win["status"]["nodeInfo"]["operatingSystem"] == "windows"
    cpu = nodes.manifest("cpu-a", nodes.NodeTemplate(gpus=0))
    assert "nvidia.com/gpu.present" not in cpu["metadata"]["labels"]
    assert nodes.GPU not in cpu["status"]["capacity"]


def test_mig_nodes_offer_only_their_profiles() -> None:
    template = nodes.NodeTemplate(gpus=2, mig={"3g.40gb": 2, "1g.10gb": 1})
    status = nodes.manifest("mig-a", template)["status"]
    assert {k: v for k, v in status["allocatable"].items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-3g.40gb": "4",
        "nvidia.com/mig-1g.10gb": "2",
    }
    with pytest.raises(ValueError):
        nodes.NodeTemplate(gpus=0, mig={"1g.10gb": 7})


def test_pool_labels_taints_and_extra_metadata_are_kept() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    template = nodes.NodeTemplate(gpus=4, labels={"cloud.google.com/gke-nodepool": "a100"}, taints=(taint,))
    body = nodes.manifest("a", template, annotations={"x": "1"}, extra_labels={"y": "2"})
    assert body["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == "a100"
    assert body["metadata"]["labels"]["y"] == "2"
    assert body["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake", "x": "1"}
    assert body["spec"]["taints"] == [taint]


def test_gpus_join_later_through_a_status_patch() -> None:
    template = nodes.NodeTemplate(gpus=2)
    body = nodes.manifest("late", template, gpus_allocatable=False)
    assert not nodes.has_gpus_allocatable(body["status"]["allocatable"], template)
    assert body["status"]["allocatable"]["cpu"] == template.cpu
    patch = nodes.gpus_allocatable_patch(template)
    assert patch == {"status": {"capacity": {nodes.GPU: "2"}, "allocatable": {nodes.GPU: "2"}}}
    patched = body["status"]["allocatable"] | patch["status"]["allocatable"]
    assert nodes.has_gpus_allocatable(patched, template)


@pytest.mark.parametrize(
    "kwargs",
    [{"gpus": 9}, {"gpus": -1}, {"gpus": 2, "shared": nodes.SharedGpus(1, 16)}],
)
def test_invalid_templates_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        nodes.NodeTemplate(**kwargs)  # type: ignore[arg-type]


def test_invalid_shared_gpus_are_refused() -> None:
    with pytest.raises(ValueError):
        nodes.SharedGpus(gpus=0, memory_gib_per_gpu=16)
    with pytest.raises(ValueError):
        nodes.SharedGpus(gpus=1, memory_gib_per_gpu=0)


def test_machine_deployment_selector_matches_its_template() -> None:
    md = capi.machine_deployment("pool-a", "ns", replicas=2)
    assert md["apiVersion"] == "cluster.x-k8s.io/v1beta2"
    match = md["spec"]["selector"]["matchLabels"]
    assert match.items() <= md["spec"]["template"]["metadata"]["labels"].items()
    template_spec = md["spec"]["template"]["spec"]
    assert {"bootstrap", "clusterName", "infrastructureRef"} <= template_spec.keys()  # required by the CRD

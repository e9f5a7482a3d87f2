"""GPU workloads for the local cluster: the Deployments the demo and the tests schedule, asking
for GPUs through device-plugin resources or through DRA claims."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

APP_LABEL = "app"
DEFAULT_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
DRA_CLAIM = "gpu"  # a DRA workload's pod claim entry, and the name its container uses


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    return {"name": name} | ({"namespace": namespace} if namespace is not None else {})


def gpu_deployment(
    name: str,
    *,
    replicas: int,
    limits: Mapping[str, str],
    node_selector: Mapping[str, str],
    namespace: str | None = None,
    container: str = "cuda",
    image: str = DEFAULT_IMAGE,
) -> dict[str, Any]:
    """A Deployment whose pods, labelled ``APP_LABEL=<name>``, ask for ``limits`` (GPU resources) on
    nodes matching ``node_selector``. kwok never runs the image; pods stop at once on deletion."""
    labels = {APP_LABEL: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, namespace) | {"labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(node_selector),
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": container, "image": image, "resources": {"limits": dict(limits)}}
                    ],
                },
            },
        },
    }


def claim_template(
    name: str,
    device_class: str,
    *,
    count: int = 1,
    selectors: Sequence[str] = (),
    all_devices: bool = False,
    request: str = "gpu",
    namespace: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaimTemplate (resource.k8s.io/v1) of one request: ``count`` devices of
    ``device_class`` (``gpu.nvidia.com``, ``mig.nvidia.com``) matching every CEL expression in
    ``selectors``, or with ``all_devices`` every matching device of a node (allocationMode All)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    exactly |= {"allocationMode": "All"} if all_devices else {"count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(name, namespace),
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }


def dra_deployment(
    name: str,
    *,
    replicas: int,
    claim_template_name: str,
    node_selector: Mapping[str, str],
    namespace: str | None = None,
    container: str = "cuda",
    image: str = DEFAULT_IMAGE,
) -> dict[str, Any]:
    """:func:`gpu_deployment` asking for its GPUs through a claim per pod, made from the
    ResourceClaimTemplate ``claim_template_name`` (pod claim entry and container claim ``gpu``)."""
    body = gpu_deployment(
        name,
        replicas=replicas,
        limits={},
        node_selector=node_selector,
        namespace=namespace,
        container=container,
        image=image,
    )
    pod = body["spec"]["template"]["spec"]
    pod["resourceClaims"] = [{"name": DRA_CLAIM, "resourceClaimTemplateName": claim_template_name}]
    pod["containers"][0]["resources"] = {"claims": [{"name": DRA_CLAIM}]}
    return body

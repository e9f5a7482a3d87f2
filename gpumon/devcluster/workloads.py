"""GPU workloads for the local cluster: the Deployment the demo and the tests schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

APP_LABEL = "app"
DEFAULT_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"


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
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
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

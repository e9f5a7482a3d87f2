"""Cluster API MachineDeployment bodies (v1beta2, the stored version of cluster-api v1.13).
Pure builders; the references they hold point at nothing, since no provider runs here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.devcluster.nodes import KUBELET_VERSION
from gpumon.devcluster.poolplan import SimulatedPoolStatus

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta2"
MACHINE_DEPLOYMENTS = "machinedeployments"
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
DEFAULT_CLUSTER_NAME = "devcluster"


def machine_deployments_path(namespace: str, name: str = "") -> str:
    """The API path of a namespace's MachineDeployments, or of one of them."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{MACHINE_DEPLOYMENTS}"
    return f"{path}/{name}" if name else path


def machine_deployment(
    name: str,
    namespace: str,
    *,
    replicas: int,
    cluster_name: str = DEFAULT_CLUSTER_NAME,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    match = {DEPLOYMENT_NAME_LABEL: name}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineDeployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster_name},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "clusterName": cluster_name,
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": {**match, CLUSTER_NAME_LABEL: cluster_name}},
                "spec": {
                    "clusterName": cluster_name,
                    "version": KUBELET_VERSION,
                    "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "KwokMachineTemplate",
                        "name": name,
                    },
                },
            },
        },
    }


def selector_string(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def status(pool: SimulatedPoolStatus, *, desired: int, generation: int, selector: str) -> dict[str, Any]:
    """The ``status`` a MachineDeployment controller would report for this pool."""
    return {
        "replicas": pool.replicas,
        "readyReplicas": pool.ready_replicas,
        "availableReplicas": pool.available_replicas,
        "upToDateReplicas": pool.replicas,
        "selector": selector,
        "observedGeneration": max(1, generation),
        "phase": "ScalingUp" if pool.available_replicas < desired else "Running",
    }

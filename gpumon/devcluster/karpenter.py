"""Karpenter v1.15.0 with its kwok cloud provider on a running devcluster: Karpenter's own
controllers launch NodeClaims for pending pods and the kwok provider creates their Nodes, which
the devcluster's kwok then runs (they carry its ``kwok.x-k8s.io/node: fake`` annotation).

Instance types come from a JSON file (``--instance-types-file-path``; the shape of the module's
``kwok/cloudprovider/instance_types.json``), one per GPU node template here: its ``resources``
map takes extended resources such as ``nvidia.com/gpu``. Started on demand, like Cluster API's
manager (gpumon.devcluster.cluster_api). DRA is left at Karpenter's default (its requests
ignored); ``node_repair=True`` turns on its ``NodeRepair`` gate (docs/autoscaling.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.devcluster import nodes
from gpumon.devcluster.binaries import Karpenter, locate_karpenter
from gpumon.devcluster.cluster import DevCluster, free_ports
from gpumon.devcluster.components import Component, HealthCheck

GROUP = "karpenter.sh"
VERSION = "v1"
NODE_POOLS = "nodepools"
NODE_CLAIMS = "nodeclaims"
KWOK_GROUP = "karpenter.kwok.sh"
NODE_CLASS = "default"  # the one KWOKNodeClass every NodePool here uses
NODEPOOL_LABEL = "karpenter.sh/nodepool"
ZONE = "test-zone-a"


@dataclass(frozen=True)
class InstanceType:
    name: str
    template: nodes.NodeTemplate
    price: float = 1.0


def instance_types_file(types: Sequence[InstanceType]) -> str:
    """The kwok provider's instance types: each offered on demand in one zone."""
    return json.dumps(
        [
            {
                "name": t.name,
                "architecture": "amd64",
                "operatingSystems": [t.template.os],
                "resources": {**nodes.shape(t.template)["resources"], "ephemeral-storage": "100Gi"},
                "offerings": [
                    {
                        "Price": t.price,
                        "Available": True,
                        "Requirements": [
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                        ],
                    }
                ],
            }
            for t in types
        ],
        indent=1,
    )


def node_class() -> dict[str, Any]:
    return {
        "apiVersion": f"{KWOK_GROUP}/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
    }


def node_pool(
    name: str,
    instance_types: Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A NodePool launching only ``instance_types``; its Nodes get ``labels`` and ``taints``
    (a test's own taint keeps the shared cluster's other pending pods off its nodes)."""
    spec: dict[str, Any] = {
        "nodeClassRef": {"group": KWOK_GROUP, "kind": "KWOKNodeClass", "name": NODE_CLASS},
        "requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(instance_types)}
        ],
    }
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"metadata": {"labels": dict(labels or {})}, "spec": spec}},
    }


def controller(
    tools: Karpenter,
    cluster: DevCluster,
    types_path: str,
    ports: tuple[int, int],
    *,
    node_repair: bool = False,
) -> Component:
    metrics, health = ports
    return Component(
        name="karpenter",
        argv=(
            str(tools.controller),
            "--disable-leader-election",
            f"--metrics-port={metrics}",
            f"--health-probe-port={health}",
            f"--instance-types-file-path={types_path}",
            *(["--feature-gates=NodeRepair=true"] if node_repair else []),
        ),
        health=HealthCheck(f"http://127.0.0.1:{health}/readyz", client_cert=False),
        wave=0,
        # Its kubeconfig comes from the environment (controller-runtime), its namespace too.
        env={"KUBECONFIG": str(cluster.kubeconfig), "SYSTEM_NAMESPACE": "kube-system"},
    )


def start(
    cluster: DevCluster,
    types: Sequence[InstanceType],
    tools: Karpenter | None = None,
    timeout_seconds: float = 120.0,
    *,
    node_repair: bool = False,
) -> None:
    """Install Karpenter's CRDs and the KWOKNodeClass, and start the controller (``node_repair``:
    with its ``NodeRepair`` feature gate on, the flag winning over a FEATURE_GATES variable). Raises
    :class:`gpumon.devcluster.binaries.ToolsMissing` when it is not built."""
    karpenter = tools or locate_karpenter()
    root = cluster.layout.root / "karpenter"
    root.mkdir(parents=True, exist_ok=True)
    cluster.install_crds(karpenter.crds, timeout_seconds)
    path = root / "instance-types.json"
    path.write_text(instance_types_file(types))
    (root / "nodeclass.yaml").write_text(json.dumps(node_class()))
    cluster.kubectl(
        "apply", "--server-side", "--field-manager=gpumon-devcluster", "-f", str(root / "nodeclass.yaml")
    )
    ports = free_ports(2)
    component = controller(karpenter, cluster, str(path), (ports[0], ports[1]), node_repair=node_repair)
    cluster.add_components([component], timeout_seconds)

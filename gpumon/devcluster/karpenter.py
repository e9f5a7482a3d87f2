"""Karpenter v1.15.0 with its kwok cloud provider on a running devcluster: Karpenter's own
controllers launch NodeClaims for pending pods and the kwok provider creates their Nodes, which
the devcluster's kwok then runs (they carry its ``kwok.x-k8s.io/node: fake`` annotation).

Instance types come from a JSON file (``--instance-types-file-path``; the shape of the module's
``kwok/cloudprovider/instance_types.json``), one per GPU node template here: its ``resources``
map takes extended resources such as ``nvidia.com/gpu``. Started on demand, like Cluster API's
manager (gpumon.devcluster.cluster_api). ``node_repair=True`` turns on its ``NodeRepair`` gate
(docs/autoscaling.md, "Karpenter's node repair and gpumon's").

DRA requests are ignored by default (``--ignore-dra-requests``, ``IGNORE_DRA_REQUESTS``,
default true: ``pkg/operator/options/options.go``); ``start(..., ignore_dra_requests=False)``
turns Karpenter's DRA scheduling on. What that needs, read from karpenter v1.15.0: the
provisioner then gathers the cluster's ResourceSlices and builds a device allocator
(``pkg/controllers/provisioning/provisioner.go``), and a NodeClaim not yet launched offers only
the devices its instance type declares (``DynamicResources.ResourceSliceTemplates``,
``pkg/controllers/provisioning/scheduling/dra.go``, ``templateSlicesForInstanceType``). The kwok
provider's instance types file has no field for them (``kwok/cloudprovider/helpers.go``:
``InstanceTypeOptions`` is name, offerings, architecture, operatingSystems, resources, and
``newInstanceType`` leaves ``DynamicResources`` zero). Karpenter's kwok DRA driver
(``dra-kwok-driver``, :func:`dra_driver`) publishes ResourceSlices for kwok Nodes that exist
(every 30 s, per a cluster-scoped ``DRAConfig``), so it would serve the scheduler once a node
is up, not Karpenter's decision to launch one; as built from v1.15.0 it cannot list its
DRAConfigs (its types are registered without ``metav1.AddToGroupVersion``,
``dra-kwok-driver/pkg/apis/v1alpha1/draconfig_types.go``) and publishes nothing
(docs/benchmarks.md, "Autoscalers")."""

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
    name: str = "karpenter",
    ignore_dra_requests: bool = True,
    node_repair: bool = False,
) -> Component:
    metrics, health = ports
    return Component(
        name=name,
        argv=(
            str(tools.controller),
            "--disable-leader-election",
            f"--metrics-port={metrics}",
            f"--health-probe-port={health}",
            f"--instance-types-file-path={types_path}",
            f"--ignore-dra-requests={'true' if ignore_dra_requests else 'false'}",
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
    name: str = "karpenter",
    ignore_dra_requests: bool = True,
    node_repair: bool = False,
) -> None:
    """Install Karpenter's CRDs and the KWOKNodeClass, and start the controller (component
    ``name``: a second one, with DRA on, once the first is stopped; ``node_repair``: with its
    ``NodeRepair`` feature gate on, the flag winning over a FEATURE_GATES variable). Raises
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
    component = controller(
        karpenter,
        cluster,
        str(path),
        (ports[0], ports[1]),
        name=name,
        ignore_dra_requests=ignore_dra_requests,
        node_repair=node_repair,
    )
    cluster.add_components([component], timeout_seconds)


# -- Karpenter's kwok DRA driver ------------------------------------------------------------------

DRA_CONFIG_GROUP = "test.karpenter.sh"
DRA_CONFIGS = "draconfigs"
DRA_CONFIG_CRD = f"{DRA_CONFIGS}.{DRA_CONFIG_GROUP}"
# dra-kwok-driver/main.go binds these, with no flag to move them.
DRA_DRIVER_METRICS_PORT = 8082
DRA_DRIVER_HEALTH_PORT = 8083


def dra_config(
    name: str, driver: str, node_labels: Mapping[str, str], devices: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A DRAConfig (``dra-kwok-driver/pkg/apis/v1alpha1/draconfig_types.go``): one ResourceSlice
    of ``devices`` (``resource.k8s.io/v1`` Devices) for ``driver`` on every kwok Node carrying
    ``node_labels``."""
    term = {"matchExpressions": [{"key": k, "operator": "In", "values": [v]} for k, v in node_labels.items()]}
    return {
        "apiVersion": f"{DRA_CONFIG_GROUP}/v1alpha1",
        "kind": "DRAConfig",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pools": [
                {
                    "name": name,
                    "nodeSelectorTerms": [term],
                    "resourceSlices": [{"devices": [dict(d) for d in devices]}],
                }
            ],
        },
    }


def dra_driver(tools: Karpenter, cluster: DevCluster) -> Component:
    """The kwok DRA driver; its ports are fixed (:data:`DRA_DRIVER_HEALTH_PORT`)."""
    return Component(
        name="karpenter-dra-kwok-driver",
        argv=(str(tools.dra_driver),),
        health=HealthCheck(f"http://127.0.0.1:{DRA_DRIVER_HEALTH_PORT}/readyz", client_cert=False),
        wave=0,
        env={"KUBECONFIG": str(cluster.kubeconfig)},
    )

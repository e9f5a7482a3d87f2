"""Cluster API bodies (v1beta2, the stored version of cluster-api v1.13). Pure builders.

For Cluster API's own manager (gpumon.devcluster.cluster_api), which reconciles only objects
carrying its watch filter label and creates Machines through the devcluster's kwok
infrastructure provider (gpumon.devcluster.capi_infra): the Cluster, its kubeconfig Secret, the
control plane stand-in, the KwokMachineTemplate, the MachineDeployment and the
MachineHealthCheck below, and the provider's CRDs. A MachineDeployment made without the
filter label (:func:`machine_deployment` alone) is an inert ``/scale`` target nothing
reconciles: what tests and benchmarks that only read gpumon's writes use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.devcluster.nodes import KUBELET_VERSION

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta2"
MACHINE_DEPLOYMENTS = "machinedeployments"
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
DEFAULT_CLUSTER_NAME = "devcluster"
MACHINES = "machines"
MACHINE_SETS = "machinesets"
MACHINE_HEALTH_CHECKS = "machinehealthchecks"
CLUSTERS = "clusters"
# Cluster API's manager reconciles only objects with this label value (its --watch-filter), so
# the inert /scale targets of other tests in the same control plane are left alone.
WATCH_FILTER_LABEL = "cluster.x-k8s.io/watch-filter"
WATCH_FILTER = "gpumon-devcluster"
# The label on a provider's CRDs that names which of its versions implement a contract.
CONTRACT_LABEL = f"{GROUP}/{VERSION}"

# The devcluster's stand-in providers: their own groups, so nothing else claims these kinds.
INFRA_GROUP = "infrastructure.devcluster.gpumon.io"
CONTROL_PLANE_GROUP = "controlplane.devcluster.gpumon.io"
PROVIDER_VERSION = "v1alpha1"
KWOK_MACHINES = "kwokmachines"
KWOK_MACHINE_TEMPLATES = "kwokmachinetemplates"


@dataclass(frozen=True)
class ReadyAtOnce:
    """A stand-in kind the provider reports ready as soon as it exists: ``status`` is what its
    Cluster API contract reads, all of it booleans set true."""

    kind: str
    group: str
    plural: str
    field: str  # status.initialization.<field>
    also: tuple[str, ...] = ()  # status.<name>

    @property
    def api_version(self) -> str:
        return f"{self.group}/{PROVIDER_VERSION}"

    @property
    def status(self) -> dict[str, Any]:
        return {"initialization": {self.field: True}, **dict.fromkeys(self.also, True)}

    def reported(self, obj: Mapping[str, Any]) -> bool:
        status = obj.get("status") or {}
        done = (status.get("initialization") or {}).get(self.field) is True
        return done and all(status.get(name) is True for name in self.also)


# The infrastructure cluster: the local network is already there. Cluster API v1.13.6 reports a
# Cluster without one as InfrastructureReady=Unknown (InternalError), and a MachineHealthCheck
# then judges no Machine, so it cannot be left out.
KWOK_CLUSTER = ReadyAtOnce("KwokCluster", INFRA_GROUP, "kwokclusters", "provisioned")
# The control plane: the API server everything runs against, already up and on no Machine, so
# externally managed (as EKS's or GKE's). Without an initialized one Cluster API neither watches
# the workload cluster's Nodes nor lets a MachineHealthCheck judge a Machine; without
# externalManagedControlPlane it finds no control-plane Machines and then neither drains nor
# deletes the Node of a Machine it deletes (``isDeleteNodeAllowed``: errNoControlPlaneNodes).
KWOK_CONTROL_PLANE = ReadyAtOnce(
    "KwokControlPlane",
    CONTROL_PLANE_GROUP,
    "kwokcontrolplanes",
    "controlPlaneInitialized",
    also=("externalManagedControlPlane",),
)
READY_AT_ONCE = (KWOK_CLUSTER, KWOK_CONTROL_PLANE)


# Kind -> plural of every object the builders below make.
PLURALS: Mapping[str, str] = {
    **{r.kind: r.plural for r in READY_AT_ONCE},
    "Cluster": CLUSTERS,
    "KwokMachineTemplate": KWOK_MACHINE_TEMPLATES,
    "MachineDeployment": MACHINE_DEPLOYMENTS,
    "MachineHealthCheck": MACHINE_HEALTH_CHECKS,
}


def collection_path(obj: Mapping[str, Any]) -> str:
    """Where to POST one of the builders' objects (their Secret included)."""
    ns = obj["metadata"]["namespace"]
    if obj["kind"] == "Secret":
        return f"/api/v1/namespaces/{ns}/secrets"
    return f"/apis/{obj['apiVersion']}/namespaces/{ns}/{PLURALS[obj['kind']]}"


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
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``labels`` go on the MachineDeployment and on its Machines (through the template).
    The bootstrap data is a Secret named directly (``dataSecretName``): no bootstrap provider
    is needed, and kwok's Nodes read no cloud-init."""
    match = {DEPLOYMENT_NAME_LABEL: name}
    extra = dict(labels or {})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineDeployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster_name, **extra},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "clusterName": cluster_name,
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": {**match, CLUSTER_NAME_LABEL: cluster_name, **extra}},
                "spec": {
                    "clusterName": cluster_name,
                    "version": KUBELET_VERSION,
                    "bootstrap": {"dataSecretName": bootstrap_secret_name(name)},
                    "infrastructureRef": {
                        "apiGroup": INFRA_GROUP,
                        "kind": "KwokMachineTemplate",
                        "name": name,
                    },
                },
            },
        },
    }


def bootstrap_secret_name(machine_deployment: str) -> str:
    return f"{machine_deployment}-bootstrap"


# -- a self-hosted management cluster: Cluster API's manager against the API server it runs on --


def _managed(name: str, namespace: str, cluster_name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {CLUSTER_NAME_LABEL: cluster_name, WATCH_FILTER_LABEL: WATCH_FILTER},
    }


def management_cluster(
    namespace: str, kubeconfig_yaml: str, *, name: str = DEFAULT_CLUSTER_NAME
) -> list[dict[str, Any]]:
    """A Cluster whose workload cluster is the management cluster itself: its kubeconfig
    Secret (``<name>-kubeconfig``, key ``value``) points back at the same API server. Its
    infrastructure cluster and control plane are the stand-ins of :data:`READY_AT_ONCE`."""
    refs = {r.kind: {"apiGroup": r.group, "kind": r.kind, "name": name} for r in READY_AT_ONCE}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _managed(f"{name}-kubeconfig", namespace, name),
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": kubeconfig_yaml},
        },
        *(
            {
                "apiVersion": r.api_version,
                "kind": r.kind,
                "metadata": _managed(name, namespace, name),
                "spec": {},
            }
            for r in READY_AT_ONCE
        ),
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Cluster",
            "metadata": _managed(name, namespace, name),
            "spec": {
                "infrastructureRef": refs[KWOK_CLUSTER.kind],
                "controlPlaneRef": refs[KWOK_CONTROL_PLANE.kind],
            },
        },
    ]


def machine_pool(
    name: str,
    namespace: str,
    node: Mapping[str, Any],
    *,
    replicas: int,
    cluster_name: str = DEFAULT_CLUSTER_NAME,
    annotations: Mapping[str, str] | None = None,
    devices_after_seconds: float = 0.0,
) -> list[dict[str, Any]]:
    """A MachineDeployment Cluster API's manager reconciles and its KwokMachineTemplate
    (``node``: the Node each Machine becomes, :func:`gpumon.devcluster.nodes.shape`; its GPUs
    registering ``devices_after_seconds`` after it joins), in creation order. The bootstrap
    Secret the Machines name need not exist: with ``dataSecretName`` and no ``configRef`` the
    core manager reads nothing (cluster-api v1.13.6, ``reconcileBootstrap``), and only an
    infrastructure provider would, which kwok's is not."""
    md = machine_deployment(
        name,
        namespace,
        replicas=replicas,
        cluster_name=cluster_name,
        annotations=annotations,
        labels={WATCH_FILTER_LABEL: WATCH_FILTER},
    )
    machine_spec: dict[str, Any] = {"node": dict(node)}
    if devices_after_seconds:
        machine_spec["devicesAfterSeconds"] = devices_after_seconds
    template = {
        "apiVersion": f"{INFRA_GROUP}/{PROVIDER_VERSION}",
        "kind": "KwokMachineTemplate",
        "metadata": _managed(name, namespace, cluster_name),
        "spec": {"template": {"spec": machine_spec}},
    }
    return [template, md]


def machine_health_check(
    name: str,
    namespace: str,
    *,
    deployment: str,
    conditions: Sequence[tuple[str, str, int]],
    cluster_name: str = DEFAULT_CLUSTER_NAME,
    max_unhealthy: str | None = None,
) -> dict[str, Any]:
    """A MachineHealthCheck over one MachineDeployment's Machines: each (node condition type,
    status, seconds) makes a Machine unhealthy once the condition has held that long."""
    spec: dict[str, Any] = {
        "clusterName": cluster_name,
        "selector": {"matchLabels": {DEPLOYMENT_NAME_LABEL: deployment}},
        "checks": {
            "unhealthyNodeConditions": [
                {"type": t, "status": status, "timeoutSeconds": seconds} for t, status, seconds in conditions
            ],
        },
    }
    if max_unhealthy is not None:
        spec["remediation"] = {"triggerIf": {"unhealthyLessThanOrEqualTo": max_unhealthy}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MachineHealthCheck",
        "metadata": _managed(name, namespace, cluster_name),
        "spec": spec,
    }


# -- the stand-in providers' CRDs ----------------------------------------------------------------

_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _crd(
    group: str, kind: str, plural: str, spec: Mapping[str, Any], status: Mapping[str, Any] | None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {"spec": spec}}
    version: dict[str, Any] = {"name": PROVIDER_VERSION, "served": True, "storage": True}
    if status is not None:
        schema["properties"]["status"] = status
        version["subresources"] = {"status": {}}
    version["schema"] = {"openAPIV3Schema": schema}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {CONTRACT_LABEL: PROVIDER_VERSION}},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [version],
        },
    }


def _bool_under(field: str) -> dict[str, Any]:
    return {"type": "object", "properties": {field: {"type": "boolean"}}}


_MACHINE_SPEC = {
    "type": "object",
    "properties": {
        "providerID": {"type": "string"},
        "node": _OBJECT,  # the Node to make: labels, taints, resources, os, dra (nodes.shape)
        # Its GPUs register that long after the Node joins (gpumon.devcluster.capi_infra_plan).
        "devicesAfterSeconds": {"type": "number"},
    },
}


def provider_crds() -> list[dict[str, Any]]:
    """The kinds Cluster API's contracts need from the stand-ins: an infrastructure machine
    (``spec.providerID``, ``status.initialization.provisioned``), its template
    (``spec.template.spec``), and the :data:`READY_AT_ONCE` kinds; each CRD labelled with the
    contract version it implements."""
    return [
        _crd(
            INFRA_GROUP,
            "KwokMachine",
            KWOK_MACHINES,
            _MACHINE_SPEC,
            {"type": "object", "properties": {"initialization": _bool_under("provisioned")}},
        ),
        _crd(
            INFRA_GROUP,
            "KwokMachineTemplate",
            KWOK_MACHINE_TEMPLATES,
            {
                "type": "object",
                "properties": {
                    "template": {
                        "type": "object",
                        "properties": {"metadata": _OBJECT, "spec": _MACHINE_SPEC},
                    }
                },
            },
            None,
        ),
        *(
            _crd(
                r.group,
                r.kind,
                r.plural,
                _OBJECT,
                {
                    "type": "object",
                    "properties": {
                        "initialization": _bool_under(r.field),
                        **{name: {"type": "boolean"} for name in r.also},
                    },
                },
            )
            for r in READY_AT_ONCE
        ),
    ]

"""What each control-plane process is: its command line, its health endpoint and when it may
start. Pure: built from the binaries, the ports and the file layout; nothing here runs anything.

Flags follow controller-runtime envtest's kube-apiserver set (docs/devcluster.md), plus the
request-header and proxy-client flags that let an aggregated API server (prometheus-adapter)
be registered later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpumon.devcluster.binaries import Tools
from gpumon.devcluster.pki import FRONT_PROXY_CLIENT_NAME, PkiFiles

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CIDR = "10.244.0.1/16"  # kwok hands out pod IPs from here; kept apart from the service range
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# Dynamic Resource Allocation. resource.k8s.io/v1 (DeviceClass, ResourceClaim,
# ResourceClaimTemplate, ResourceSlice) is GA and served by default in v1.36.3, and so are the
# beta gates gpumon's DRA tests lean on (DRAExtendedResource, DRAPartitionableDevices,
# DRADeviceTaints, DRAConsumableCapacity). DeviceTaintRule is the exception: its gate
# DRADeviceTaintRules is beta but off by default, and its API, resource.k8s.io/v1beta2
# devicetaintrules, is a beta API and so off by default too. The gate is read by the API server
# (bootstrap RBAC lets the scheduler and KCM's device-taint-eviction controller read the rules),
# by the scheduler (it hides tainted devices from allocation) and by KCM (that controller watches
# the rules and writes their status), so all three get it; only the API server serves the
# resource (docs/devcluster.md, "Dynamic Resource Allocation").
DRA_FEATURE_GATES = "DRADeviceTaintRules=true"
DRA_RUNTIME_CONFIG = "resource.k8s.io/v1beta2/devicetaintrules=true"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


@dataclass(frozen=True)
class Layout:
    """Every file a cluster's processes read or write, under one directory."""

    root: Path
    pki: PkiFiles

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def device_classes(self) -> Path:
        return self.root / "deviceclasses.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """One JSON line per watch the API server starts (:func:`audit_policy`)."""
        return self.root / "audit.log"

    def kubeconfig(self, user: str) -> Path:
        return self.root / f"{user}.kubeconfig"


KWOK_POD_WORKERS = 4  # kwok v0.8.0's default


@dataclass(frozen=True)
class Options:
    # kwok renews node leases every lease/4 = 10 s; a grace of two renewals keeps a busy
    # 2-core machine from flapping nodes NotReady while still noticing a dead node in 20 s.
    node_monitor_grace_period_seconds: int = 20
    node_monitor_period_seconds: int = 1
    node_lease_duration_seconds: int = 40
    # The HPA controller's resync (15 s upstream): every HPA step waits up to this long, and no
    # test but the end-to-end HPA one runs an HPA, so a shorter period costs the others nothing.
    hpa_sync_period_seconds: int = 5
    # Appended to etcd's and the API server's command lines: what a benchmark tunes for a large
    # fleet (bench/controller_scale.py, docs/benchmarks.md); tests leave them empty.
    etcd_flags: tuple[str, ...] = ()
    apiserver_flags: tuple[str, ...] = ()
    # kwok's workers playing pod stages (Pending -> Running): each waits on one status PATCH, so
    # on a loaded API server four of them brought 100,000 pods to Running at under 40 a second.
    kwok_pod_workers: int = KWOK_POD_WORKERS


@dataclass(frozen=True)
class HealthCheck:
    url: str
    client_cert: bool  # the endpoint needs the admin client certificate (the API server's does)
    # Healthy only when the answer's body also holds this text.
    expect: str | None = None


@dataclass(frozen=True)
class Component:
    name: str
    argv: tuple[str, ...]
    health: HealthCheck
    wave: int  # started after every component of a lower wave is healthy
    env: Mapping[str, str] = field(default_factory=dict)  # added to the environment


def _loopback(port: int, scheme: str = "https") -> str:
    return f"{scheme}://127.0.0.1:{port}"


def etcd(tools: Tools, ports: Ports, layout: Layout, options: Options) -> Component:
    client = _loopback(ports.etcd_client, "http")
    peer = _loopback(ports.etcd_peer, "http")
    return Component(
        name="etcd",
        argv=(
            str(tools.etcd),
            "--name=gpumon-devcluster",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpumon-devcluster={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
            *options.etcd_flags,
        ),
        health=HealthCheck(f"{client}/readyz", client_cert=False),
        wave=0,
    )


def kube_apiserver(tools: Tools, ports: Ports, layout: Layout, options: Options) -> Component:
    pki = layout.pki
    return Component(
        name="kube-apiserver",
        argv=(
            str(tools.kube_apiserver),
            f"--etcd-servers={_loopback(ports.etcd_client, 'http')}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Endpoints may not hold loopback addresses, so the `kubernetes` Service keeps none.
            "--endpoint-reconciler-type=none",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT_NAME}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            "--enable-aggregator-routing=true",
            f"--feature-gates={DRA_FEATURE_GATES}",
            f"--runtime-config={DRA_RUNTIME_CONFIG}",
            f"--audit-policy-file={layout.audit_policy}",
            f"--audit-log-path={layout.audit_log}",
            "--audit-log-format=json",
            *options.apiserver_flags,
        ),
        health=HealthCheck(f"{_loopback(ports.apiserver)}/readyz", client_cert=True),
        wave=1,
    )


def _secure_serving(layout: Layout, port: int, user: str) -> tuple[str, ...]:
    kubeconfig = layout.kubeconfig(user)
    return (
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={layout.pki.serving_cert}",
        f"--tls-private-key-file={layout.pki.serving_key}",
        f"--client-ca-file={layout.pki.ca_cert}",
        "--leader-elect=false",
    )


def kube_controller_manager(tools: Tools, ports: Ports, layout: Layout, options: Options) -> Component:
    pki = layout.pki
    return Component(
        name="kube-controller-manager",
        argv=(
            str(tools.kube_controller_manager),
            *_secure_serving(layout, ports.controller_manager, "kube-controller-manager"),
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--node-monitor-period={options.node_monitor_period_seconds}s",
            f"--node-monitor-grace-period={options.node_monitor_grace_period_seconds}s",
            f"--horizontal-pod-autoscaler-sync-period={options.hpa_sync_period_seconds}s",
            f"--feature-gates={DRA_FEATURE_GATES}",
        ),
        # Its plain /healthz says ok before it has built its controllers, and it exits if the API
        # server goes away meanwhile; the verbose answer lists the controllers once they run.
        health=HealthCheck(
            f"{_loopback(ports.controller_manager)}/healthz?verbose",
            client_cert=False,
            expect="-controller ok",
        ),
        wave=2,
    )


def kube_scheduler(tools: Tools, ports: Ports, layout: Layout) -> Component:
    return Component(
        name="kube-scheduler",
        argv=(
            str(tools.kube_scheduler),
            *_secure_serving(layout, ports.scheduler, "kube-scheduler"),
            f"--feature-gates={DRA_FEATURE_GATES}",
        ),
        health=HealthCheck(f"{_loopback(ports.scheduler)}/readyz", client_cert=False),
        wave=2,
    )


def kwok(tools: Tools, ports: Ports, layout: Layout, options: Options) -> Component:
    return Component(
        name="kwok",
        argv=(
            str(tools.kwok),
            f"--kubeconfig={layout.kubeconfig('kwok')}",
            f"--config={layout.kwok_config}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
            f"--node-lease-duration-seconds={options.node_lease_duration_seconds}",
            f"--server-address=127.0.0.1:{ports.kwok}",
        ),
        health=HealthCheck(f"{_loopback(ports.kwok, 'http')}/healthz", client_cert=False),
        wave=2,
    )


def all_components(tools: Tools, ports: Ports, layout: Layout, options: Options) -> tuple[Component, ...]:
    return (
        etcd(tools, ports, layout, options),
        kube_apiserver(tools, ports, layout, options),
        kube_controller_manager(tools, ports, layout, options),
        kube_scheduler(tools, ports, layout),
        kwok(tools, ports, layout, options),
    )


# A KwokConfiguration document given in --config is not defaulted (kwok v0.8.0 defaults only
# when none is given), and a zero parallelism makes kwok exit: spell out the module's defaults.
KWOK_OPTIONS = {
    "cidr": POD_CIDR,
    "podPlayStageParallelism": KWOK_POD_WORKERS,
    "nodePlayStageParallelism": 4,
    "nodeLeaseParallelism": 4,
    "podsOnNodeSyncParallelism": 1,
    "enablePodsOnNodeSyncListPager": True,
    "enablePodsOnNodeSyncStreamWatch": False,
}


def audit_policy() -> str:
    """The API server's audit policy, with user and request URI: every watch, once, when it
    starts (the ResponseStarted stage of a long-running request), and every delete of a Cluster
    API Machine or Karpenter NodeClaim once it is answered; nothing else. The tests count watches
    by (resource, selectors) from it (tests/cluster/test_controller_watches.py) and tell who
    deleted a Machine (tests/cluster/test_repair_replace.py)."""
    deletes = [
        {"group": "cluster.x-k8s.io", "resources": ["machines"]},
        {"group": "karpenter.sh", "resources": ["nodeclaims"]},
    ]
    return yaml.safe_dump(
        {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived", "Panic"],
            "rules": [
                {"level": "Metadata", "verbs": ["watch"], "omitStages": ["ResponseComplete"]},
                {
                    "level": "Metadata",
                    "verbs": ["delete"],
                    "resources": deletes,
                    "omitStages": ["ResponseStarted"],
                },
                {"level": "None"},
            ],
        },
        sort_keys=False,
    )


def kwok_config(stage_texts: Sequence[str], pod_workers: int = KWOK_POD_WORKERS) -> str:
    """kwok's ``--config``: a KwokConfiguration document, then the Stage documents verbatim.

    Standalone kwok loads no stages of its own, so without these nodes never become Ready."""
    for text in stage_texts:
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict) or doc.get("kind") != "Stage":
                raise ValueError(f"not a kwok Stage document: {str(doc)[:80]!r}")
    head = yaml.safe_dump(
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {**KWOK_OPTIONS, "podPlayStageParallelism": pod_workers},
        },
        sort_keys=False,
    )
    stages = [t.strip().removeprefix("---").strip() + "\n" for t in stage_texts]
    return "---\n".join([head, *stages])

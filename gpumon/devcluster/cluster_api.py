"""Cluster API's own core manager on a running devcluster, as a self-hosted management cluster:
the manager runs against the local API server, and the Clusters it manages point back at the
same API server (gpumon.devcluster.capi.management_cluster). Beside it runs the kwok
infrastructure provider (gpumon.devcluster.capi_infra), the one stand-in.

What the manager needs, read from cluster-api v1.13.6 (``main.go``, ``config/``):

- every core CRD (``config/crd/bases``), with its conversion webhook (the ``webhook_in_*``
  patches: ``/convert`` on the manager's webhook server);
- its webhook server always runs (no flag turns it off; its readiness check is the server's):
  a serving certificate in ``--webhook-cert-dir``, issued here by the cluster CA, which is
  also every webhook's ``caBundle``;
- the mutating and validating webhook configurations (``config/webhook/manifests.yaml``),
  served by ``service`` there and by ``url`` on the manager's loopback port here, applied once
  the manager is ready (before, every create of a Cluster API object would be refused);
- ``--watch-filter``: it reconciles only objects labelled ``cluster.x-k8s.io/watch-filter``
  with that value, so the inert MachineDeployments other tests use as bare ``/scale`` targets
  in the same control plane (a Karpenter-pool refusal, the live dashboards, the fleet
  benchmarks) stay as they made them; the webhooks get the same label as their
  ``objectSelector`` here, for the same reason (the objects the manager creates carry it too:
  it is in their templates).

Started on demand (a test session's first Cluster API test, ``gpumon demo``): it costs every
other test nothing."""

from __future__ import annotations

import base64
import datetime
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpumon.devcluster import capi, kubeconfig, pki
from gpumon.devcluster.binaries import ClusterApi, locate_cluster_api
from gpumon.devcluster.cluster import DevCluster, free_ports
from gpumon.devcluster.components import Component, HealthCheck

MANAGER = pki.ClientIdentity("cluster-api-manager", ("system:masters",))
MANAGER_NAME = "cluster-api"
PROVIDER_NAME = "capi-infra-kwok"


@dataclass(frozen=True)
class ManagerPorts:
    webhook: int
    health: int
    provider_health: int


@dataclass(frozen=True)
class ClusterApiRunning:
    """What tests need to create Clusters the manager reconciles."""

    kubeconfig_yaml: str  # the manager's own credentials: a Cluster's kubeconfig Secret holds them
    ports: ManagerPorts
    timings: Mapping[str, float]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def with_conversion_webhook(crd: Mapping[str, Any], port: int, ca_pem: bytes) -> dict[str, Any]:
    """A Cluster API CRD as its ``webhook_in_*`` patch makes it, served on loopback."""
    out = dict(crd)
    out["spec"] = {
        **crd["spec"],
        "conversion": {
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": _url(port, "/convert"), "caBundle": _b64(ca_pem)},
            },
        },
    }
    return out


def on_loopback(configuration: Mapping[str, Any], port: int, ca_pem: bytes) -> dict[str, Any]:
    """A webhook configuration of ``config/webhook/manifests.yaml`` with each ``service``
    reference replaced by the same path on the manager's loopback port, and limited to the
    objects the manager reconciles (its watch filter label): the inert MachineDeployments of
    other tests keep the shape those tests expect (the defaulting webhook would add the
    cluster-name label to their selectors)."""
    only_managed = {"matchLabels": {capi.WATCH_FILTER_LABEL: capi.WATCH_FILTER}}
    webhooks = []
    for hook in configuration.get("webhooks") or ():
        service = hook["clientConfig"]["service"]
        client_config = {"url": _url(port, service["path"]), "caBundle": _b64(ca_pem)}
        webhooks.append({**hook, "clientConfig": client_config, "objectSelector": only_managed})
    return {**configuration, "webhooks": webhooks}


def manager(binary: Path, kubeconfig_path: Path, cert_dir: Path, ports: ManagerPorts) -> Component:
    return Component(
        name=MANAGER_NAME,
        argv=(
            str(binary),
            f"--kubeconfig={kubeconfig_path}",
            f"--webhook-port={ports.webhook}",
            f"--webhook-cert-dir={cert_dir}",
            f"--health-addr=127.0.0.1:{ports.health}",
            "--diagnostics-address=0",  # no metrics server: nothing scrapes it here
            f"--watch-filter={capi.WATCH_FILTER}",
            "--leader-elect=false",
        ),
        health=HealthCheck(f"http://127.0.0.1:{ports.health}/readyz", client_cert=False),
        wave=0,
    )


def provider(kubeconfig_path: Path, ports: ManagerPorts) -> Component:
    return Component(
        name=PROVIDER_NAME,
        argv=(
            sys.executable,
            "-m",
            "gpumon.devcluster.capi_infra",
            f"--kubeconfig={kubeconfig_path}",
            f"--health-port={ports.provider_health}",
        ),
        health=HealthCheck(f"http://127.0.0.1:{ports.provider_health}/healthz", client_cert=False),
        wave=0,
    )


def _write_docs(path: Path, docs: Sequence[Mapping[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path


def start(
    cluster: DevCluster, tools: ClusterApi | None = None, timeout_seconds: float = 180.0
) -> ClusterApiRunning:
    """Install the CRDs, start the manager and the provider, then register the webhooks.
    Raises :class:`gpumon.devcluster.binaries.ToolsMissing` when the manager is not built,
    :class:`gpumon.devcluster.cluster.StartupError` when something does not come up."""
    capi_tools = tools or locate_cluster_api()
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    root = cluster.layout.root / "cluster-api"
    cert_dir = root / "webhook-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.read_ca(cluster.layout.pki)
    serving = pki.loopback_serving(ca, "cluster-api-webhooks", now)
    for name, data in (("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem)):
        (cert_dir / name).write_bytes(data)
        (cert_dir / name).chmod(0o600)
    doc = kubeconfig.build(cluster.server, ca.cert_pem, pki.client(ca, MANAGER, now), MANAGER.user)
    manager_kubeconfig = kubeconfig.write(doc, root / "manager.kubeconfig")
    ports = ManagerPorts(*free_ports(3))

    crds = [
        with_conversion_webhook(yaml.safe_load(p.read_text()), ports.webhook, ca.cert_pem)
        for p in capi_tools.crds
    ]
    crd_files = [
        _write_docs(root / f"crd-{i:02d}.yaml", [c]) for i, c in enumerate(crds + capi.provider_crds())
    ]
    cluster.install_crds(crd_files, timeout_seconds)
    timings["crds"] = time.monotonic() - t0

    t = time.monotonic()
    cluster.add_components(
        [
            manager(capi_tools.manager, manager_kubeconfig, cert_dir, ports),
            provider(cluster.kubeconfig, ports),
        ],
        timeout_seconds,
    )
    timings["manager ready"] = time.monotonic() - t

    configurations = [
        on_loopback(d, ports.webhook, ca.cert_pem)
        for d in yaml.safe_load_all(capi_tools.webhooks.read_text())
        if d
    ]
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=gpumon-devcluster",
        "-f",
        str(_write_docs(root / "webhooks.yaml", configurations)),
    )
    timings["total"] = time.monotonic() - t0
    return ClusterApiRunning(yaml.safe_dump(doc, sort_keys=False), ports, timings)

"""auth.mode kubernetes on the real API server (RBAC on), with the chart's own RBAC applied for
real: the exporter (its own process, credentials from $KUBECONFIG holding its ServiceAccount's
token, as a pod's would be) and the controller (in-process, as its ServiceAccount) each review
callers with TokenReview + SubjectAccessReview, over TLS.

- no token: 401; a ServiceAccount token without the metrics-reader role: 403; with it: 200;
  the probes answer without a token;
- the exporter's /api/v1/... is not open to every token (the API server's own /api/* is);
- the controller reads the exporter over https (CA file, server name) with its own
  ServiceAccount token, which the chart's ClusterRole lets through;
- `gpumon doctor` reads the exporter's snapshot with the exporter's own ServiceAccount token.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from chart_render import render
from controller_harness import _write_kubeconfig
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client

from gpumon.config import ExporterConfig
from gpumon.config.controller import ControllerConfig
from gpumon.controller.app import CONTROLLER, make_app
from gpumon.controller.shell.signal_sources.direct import DirectSource
from gpumon.devcluster.cluster import DevCluster, free_ports
from gpumon.devcluster.waiting import eventually
from gpumon.doctor import endpoint
from gpumon.doctor.result import Status
from gpumon.httpauth.tls import server_context
from gpumon.kube.client import connect

RELEASE = "sa"
EXPORTER_NAME = "sa-gpumon-exporter.test.svc"
CONTROLLER_NAME = "sa-gpumon-controller.test.svc"


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_tls(directory: Path) -> Tls:
    """A CA and one serving certificate for both Services' names, as the chart's Certificate."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpumon-test-ca")])

    def base(subject: x509.Name, public: Any) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )

    ca = (
        base(ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    sans = [x509.DNSName(EXPORTER_NAME), x509.DNSName(CONTROLLER_NAME)]
    leaf = (
        base(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpumon")]), key.public_key())
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    tls = Tls(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(_pem_key(key))
    return tls


@dataclass(frozen=True)
class Accounts:
    """Tokens (TokenRequest) of the chart's ServiceAccounts and of two scrapers."""

    exporter: str
    controller: str
    scraper: str
    stranger: str


async def _token(core: client.CoreV1Api, namespace: str, account: str) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    token: str = (
        await core.create_namespaced_service_account_token(account, namespace, request)
    ).status.token
    return token


@pytest.fixture
async def accounts(
    helm: Path, devcluster: DevCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[Accounts]:
    """The chart's RBAC for auth.mode kubernetes (release ``sa``), applied for real; the
    metrics-reader role bound to ``scraper``; ``stranger`` has no role."""
    values = {
        "auth.mode": "kubernetes",
        "auth.kubernetes.metricsReaderRole.subjects": [
            {"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}
        ],
    }
    rbac = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"}
    docs = [d for d in render(helm, values, release=RELEASE, namespace=namespace) if d["kind"] in rbac]
    # Cluster-scoped names carry the namespace: tests share one API server.
    for d in docs:
        if d["kind"].startswith("Cluster"):
            d["metadata"]["name"] += f"-{namespace}"
        if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"].startswith(f"{RELEASE}-gpumon"):
            d["roleRef"]["name"] += f"-{namespace}"
    for name in ("scraper", "stranger"):
        docs.append(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    kubectl = [str(devcluster.tools.kubectl), f"--kubeconfig={devcluster.kubeconfig}"]
    apply = [*kubectl, "apply", "--server-side", "-f", str(manifest)]
    await asyncio.to_thread(subprocess.run, apply, check=True, capture_output=True)
    core = client.CoreV1Api(api)
    try:
        yield Accounts(
            *[
                await _token(core, namespace, account)
                for account in (
                    f"{RELEASE}-gpumon-exporter",
                    f"{RELEASE}-gpumon-controller",
                    "scraper",
                    "stranger",
                )
            ]
        )
    finally:
        delete = [*kubectl, "delete", "--wait=false", "-f", str(manifest)]
        await asyncio.to_thread(subprocess.run, delete, capture_output=True)


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    return make_tls(tmp_path)


@pytest.fixture
def exporter(devcluster: DevCluster, accounts: Accounts, tls: Tls, tmp_path: Path) -> Iterator[str]:
    """``gpumon exporter`` on simulated GPUs, auth.mode kubernetes, HTTPS; its base URL."""
    (port,) = free_ports(1)
    kubeconfig = _write_kubeconfig(devcluster.kubeconfig, accounts.exporter, tmp_path / "exporter.kubeconfig")
    log = (tmp_path / "exporter.log").open("w+b")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GPUMON_PODS__ENABLED": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "simulated", "--node-name", "n1",
         "--listen-address", "127.0.0.1", "--port", str(port), "--auth-mode", "kubernetes",
         "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.seek(0)
        print(log.read().decode(errors="replace")[-4000:])
        log.close()


async def _status(session: aiohttp.ClientSession, url: str, token: str | None, name: str) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with session.get(url, headers=headers, server_hostname=name) as resp:
        return resp.status


async def _refusals(session: aiohttp.ClientSession, base: str, name: str, accounts: Accounts) -> list[int]:
    """/metrics without a token, with the stranger's, with the scraper's; then /readyz bare."""
    statuses = [
        await _status(session, base + "/metrics", t, name)
        for t in (None, accounts.stranger, accounts.scraper)
    ]
    return [*statuses, await _status(session, base + "/readyz", None, name)]


async def test_exporter_and_controller_review_scrapers_on_the_real_api_server(
    devcluster: DevCluster,
    namespace: str,
    accounts: Accounts,
    tls: Tls,
    exporter: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client())) as session:

        async def exporter_ready() -> bool | None:
            try:
                return await _status(session, exporter + "/readyz", None, EXPORTER_NAME) == 200 or None
            except aiohttp.ClientError:
                return None

        await eventually(exporter_ready, what="the exporter answers /readyz over https")
        assert await _refusals(session, exporter, EXPORTER_NAME, accounts) == [401, 403, 200, 200]
        # /api/v1/... is reviewed as /gpumon/api/v1/...: the scraper's token (and any other,
        # though every authenticated user may get the API server's /api/*) is refused.
        assert await _status(session, exporter + "/api/v1/snapshot", accounts.scraper, EXPORTER_NAME) == 403

        # `gpumon doctor` in the exporter's pod presents that pod's token (here the kubeconfig
        # the exporter runs on), which the chart's exporter ClusterRole lets read the snapshot.
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "exporter.kubeconfig"))
        doctor_config = ExporterConfig.model_validate(
            {
                "listen_address": "127.0.0.1",
                "port": int(exporter.rsplit(":", 1)[1]),
                "tls": {"cert_file": tls.cert, "key_file": tls.key},
                "auth": {"mode": "kubernetes"},
            }
        )
        facts = await asyncio.to_thread(endpoint.gather, doctor_config, timeout_seconds=10)
        assert facts.snapshot is not None and facts.snapshot.status == 200, facts
        assert [r.status for r in endpoint.judge(facts, 60.0)] == [Status.OK, Status.OK]

        token_file = tmp_path / "controller.token"
        token_file.write_text(accounts.controller)
        kubeconfig = _write_kubeconfig(
            devcluster.kubeconfig, accounts.controller, tmp_path / "controller.kubeconfig"
        )
        config = ControllerConfig.model_validate(
            {
                "kubeconfig": kubeconfig,
                "namespace": namespace,
                "identity": "c0",
                "state_configmap": f"{RELEASE}-gpumon-controller",
                "leader": {"lease_name": f"{RELEASE}-gpumon-controller"},
                "tls": {"cert_file": tls.cert, "key_file": tls.key},
                "auth": {"mode": "kubernetes"},
                "signals": {
                    "source": "direct",
                    "direct": {
                        "endpoints": {"n1": exporter},
                        "ca_file": tls.ca,
                        "server_name": EXPORTER_NAME,
                        "bearer_token_file": token_file,
                        "heartbeat_seconds": 0.5,
                    },
                },
            }
        )
        kube = connect(kubeconfig)
        runner = web.AppRunner(make_app(config, kube), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(config.tls)).start()
            host, port = runner.addresses[0][:2]
            base = f"https://{host}:{port}"
            controller = runner.app[CONTROLLER]

            async def synced() -> bool | None:
                return all(v.synced.is_set() for v in controller.views) or None

            # /readyz answers 200 only once the caches are filled: asked before, it is 503.
            await eventually(synced, what="the controller's caches synced")
            assert await _refusals(session, base, CONTROLLER_NAME, accounts) == [401, 403, 200, 200]
            source = controller.source
            assert isinstance(source, DirectSource)

            async def streaming() -> bool | None:
                return source.connected == 1 or None

            # Its own token, reviewed by the exporter, allowed by the chart's ClusterRole.
            await eventually(streaming, what="the controller's watch stream to the exporter, over https")
        finally:
            await runner.cleanup()
            await kube.close()

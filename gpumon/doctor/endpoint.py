"""The exporter's own endpoint on this node: answering, ready, and how old its last sample is
(``/readyz`` and ``/api/v1/snapshot``, with the exporter's configured credentials)."""

from __future__ import annotations

import base64
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.config import ExporterConfig
from gpumon.doctor.result import CheckResult, Status
from gpumon.kube.credentials import CredentialsError, load_credentials
from gpumon.wire import v1 as wire

FAMILY = "exporter"
NAME = "exporter endpoint"
# A sample older than this many fast intervals (and at least _MIN_STALE_SECONDS) is stale.
_STALE_INTERVALS = 3
_MIN_STALE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    url: str
    error: str | None = None  # transport failure: nothing answered
    ready: Reply | None = None
    snapshot: Reply | None = None
    now: float = 0.0  # wall time when the snapshot was read


def base_url(config: ExporterConfig) -> str:
    """Where the exporter of ``config`` answers from this machine."""
    listen = config.listen_address
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen, listen)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if config.tls.cert_file is not None else "http"
    return f"{scheme}://{host}:{config.port}"


def _authorization(config: ExporterConfig) -> str | None:
    auth = config.auth
    if auth.mode == "kubernetes":
        # The exporter reviews a token with the API server: doctor, run in the exporter's pod,
        # presents that pod's service account token (the chart lets it read the snapshot).
        try:
            return load_credentials().headers().get("Authorization")
        except (CredentialsError, OSError):
            return None
    if auth.bearer_token_file is not None:
        try:
            return "Bearer " + auth.bearer_token_file.read_text().strip()
        except OSError:
            return None
    if auth.basic_username is not None and auth.basic_password is not None:
        raw = f"{auth.basic_username}:{auth.basic_password.get_secret_value()}".encode()
        return "Basic " + base64.b64encode(raw).decode()
    return None


def _get(url: str, headers: dict[str, str], timeout_seconds: float) -> Reply:
    # The exporter's certificate names the node, not 127.0.0.1: doctor checks that it answers.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds, context=context) as r:
            return Reply(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read())


def gather(
    config: ExporterConfig, *, timeout_seconds: float, wall_clock: Callable[[], float] = time.time
) -> EndpointFacts:
    url = base_url(config)
    headers = {"Accept": "application/json"}
    token = _authorization(config)
    if token is not None:
        headers["Authorization"] = token
    try:
        ready = _get(url + "/readyz", {}, timeout_seconds)
        snapshot = _get(url + "/api/v1/snapshot", headers, timeout_seconds)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return EndpointFacts(url, error=str(reason))
    return EndpointFacts(url, ready=ready, snapshot=snapshot, now=wall_clock())


# ---------------------------------------------------------------------------------------------
# Judgement (pure)


def judge(facts: EndpointFacts, fast_interval_seconds: float) -> list[CheckResult]:
    if facts.error is not None or facts.ready is None or facts.snapshot is None:
        return [
            CheckResult(
                FAMILY,
                NAME,
                Status.FAIL,
                f"nothing answers at {facts.url} ({facts.error})",
                "is the exporter running on this node? (kubectl get pods -o wide); pass --port if it "
                "listens elsewhere",
            )
        ]
    return [_readiness(facts), _sample_age(facts, fast_interval_seconds)]


def _readiness(facts: EndpointFacts) -> CheckResult:
    assert facts.ready is not None
    text = facts.ready.body.decode(errors="replace").strip()
    if facts.ready.status != 200:
        return CheckResult(
            FAMILY,
            NAME,
            Status.WARN,
            f"{facts.url} answers, /readyz {facts.ready.status}: {text}",
            "the exporter's log says why (NVML down: see the nvml checks); it recovers by itself",
        )
    return CheckResult(FAMILY, NAME, Status.OK, f"{facts.url} answers and is ready")


def _sample_age(facts: EndpointFacts, fast_interval_seconds: float) -> CheckResult:
    snapshot = facts.snapshot
    assert snapshot is not None
    name = "last sample"
    if snapshot.status in (401, 403):
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            f"/api/v1/snapshot refused the credentials ({snapshot.status})",
            "run doctor with the exporter's --config (or --bearer-token-file) to use its credentials; "
            "with --auth-mode kubernetes, run it in the exporter's pod: it presents that pod's "
            "service account token, which the chart lets get /gpumon/api/v1/snapshot",
        )
    if snapshot.status != 200:
        text = snapshot.body.decode(errors="replace").strip()[:200]
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            f"/api/v1/snapshot answered {snapshot.status}: {text}",
            "wait for the first sample; if it never comes, the exporter's log says which call hangs",
        )
    try:
        doc = wire.parse_snapshot(snapshot.body)
    except wire.WireError as e:
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            f"/api/v1/snapshot is not a snapshot of wire schema {wire.SCHEMA_VERSION} ({e})",
            "an exporter of another gpumon version, or not gpumon's exporter on this port: "
            "compare `gpumon version` with the exporter's gpumon_exporter_build_info",
        )
    backend_up = doc.backend_up
    age = max(0.0, facts.now - doc.taken_at)
    limit = max(_MIN_STALE_SECONDS, _STALE_INTERVALS * fast_interval_seconds)
    found = f"{age:.1f}s ago"
    if not backend_up:
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            found + ", with the device backend down: GPU data is stale",
            "see the nvml checks; the exporter re-opens NVML with backoff",
        )
    if age > limit:
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            f"{found}: older than {limit:g}s, the sampler is stuck",
            'look for hung device calls: gpumon_exporter_errors_total{kind="timeout"} and the exporter log',
        )
    return CheckResult(FAMILY, name, Status.OK, found)

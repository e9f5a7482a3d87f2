"""gpumon.httpauth: Kubernetes-delegated authorization (TokenReview + SubjectAccessReview) with a
fake API answering as the API server does, its cache and failure modes; the middleware both
servers use; the controller's TLS and CA options. The real API server: tests/cluster/test_scrape_auth.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gpumon.config import AuthConfig, KubernetesAuthConfig, TlsConfig
from gpumon.config.controller import ControllerConfig
from gpumon.config.files import ConfigError
from gpumon.httpauth import guard as guard_module
from gpumon.httpauth import static as static_module
from gpumon.httpauth.guard import guard
from gpumon.httpauth.kubernetes import ACCESS_REVIEWS, TOKEN_REVIEWS, KubernetesReviewer, review_path, verb_of
from gpumon.httpauth.tls import client_context, server_context
from gpumon.runtime.tasks import Supervisor

Client = TestClient[Any, Any]
MakeClient = Callable[..., Awaitable[Client]]


class FakeApi:
    """TokenReview: tokens in ``users`` authenticate as that user; SubjectAccessReview: allowed
    when (user, verb, path) is in ``grants``. ``fail`` raises instead; ``hold`` blocks reviews."""

    def __init__(self) -> None:
        self.users = {"prom-token": "system:serviceaccount:monitoring:prometheus"}
        self.grants = {("system:serviceaccount:monitoring:prometheus", "get", "/metrics")}
        self.calls: list[tuple[str, Mapping[str, Any]]] = []
        self.fail: Exception | None = None
        self.answer: Mapping[str, Any] | None = None
        self.hold: asyncio.Event | None = None

    async def post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append((path, body))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        if self.answer is not None:
            return self.answer
        spec = body["spec"]
        if path == TOKEN_REVIEWS:
            user = self.users.get(spec["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            groups = ["system:serviceaccounts", "system:authenticated"]
            return {
                "status": {"authenticated": True, "user": {"username": user, "uid": "u1", "groups": groups}}
            }
        assert path == ACCESS_REVIEWS
        attrs = spec["nonResourceAttributes"]
        return {"status": {"allowed": (spec["user"], attrs["verb"], attrs["path"]) in self.grants}}

    def token_reviews(self) -> int:
        return sum(1 for path, _ in self.calls if path == TOKEN_REVIEWS)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reviewer(
    api: FakeApi, errors: list[str], clock: Clock | None = None, **settings: Any
) -> KubernetesReviewer:
    return KubernetesReviewer(
        KubernetesAuthConfig(**settings), on_error=errors.append, api=api, clock=clock or Clock()
    )


async def test_decisions_and_what_the_reviews_carry() -> None:
    api, errors = FakeApi(), list[str]()
    r = reviewer(api, errors)
    assert (await r.decide("prom-token", "get", "/metrics")).status == 200
    assert (await r.decide("prom-token", "get", "/api/v1/snapshot")).status == 403
    assert (await r.decide("prom-token", "create", "/metrics")).status == 403
    assert (await r.decide("forged", "get", "/metrics")).status == 401
    access = next(body["spec"] for path, body in api.calls if path == ACCESS_REVIEWS)
    assert access == {
        "user": "system:serviceaccount:monitoring:prometheus",
        "uid": "u1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    assert errors == []


def test_discovery_paths_are_reviewed_under_gpumon() -> None:
    assert [review_path(p) for p in ("/metrics", "/api/v1/watch", "/apis/x", "/api", "/apix")] == [
        "/metrics",
        "/gpumon/api/v1/watch",
        "/gpumon/apis/x",
        "/gpumon/api",
        "/apix",
    ]


def test_verbs_are_kube_rbac_proxys() -> None:
    assert [verb_of(m) for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")] == [
        "get",
        "get",
        "create",
        "update",
        "patch",
        "delete",
    ]


async def test_decisions_are_cached_for_the_ttl_then_asked_again() -> None:
    api, errors, clock = FakeApi(), list[str](), Clock()
    r = reviewer(api, errors, clock, cache_ttl_seconds=10)
    for _ in range(50):
        assert (await r.decide("prom-token", "get", "/metrics")).status == 200
        assert (await r.decide("forged", "get", "/metrics")).status == 401
    assert api.token_reviews() == 2
    clock.now += 10.5
    assert (await r.decide("prom-token", "get", "/metrics")).status == 200
    assert api.token_reviews() == 3
    # A revoked grant is seen once the cached decision has expired.
    api.grants.clear()
    clock.now += 10.5
    assert (await r.decide("prom-token", "get", "/metrics")).status == 403


async def test_ttl_zero_asks_every_time() -> None:
    api, errors = FakeApi(), list[str]()
    r = reviewer(api, errors, cache_ttl_seconds=0)
    for _ in range(3):
        await r.decide("prom-token", "get", "/metrics")
    assert api.token_reviews() == 3


async def test_the_cache_is_bounded_oldest_out() -> None:
    api, errors = FakeApi(), list[str]()
    r = reviewer(api, errors, cache_max_entries=2)
    for path in ("/a", "/b", "/c"):
        await r.decide("prom-token", "get", path)
    await r.decide("prom-token", "get", "/c")
    await r.decide("prom-token", "get", "/b")
    assert api.token_reviews() == 3
    await r.decide("prom-token", "get", "/a")  # evicted first
    assert api.token_reviews() == 4


async def test_a_storm_shares_one_review_and_a_hang_up_does_not_cancel_it() -> None:
    api, errors = FakeApi(), list[str]()
    api.hold = asyncio.Event()
    r = reviewer(api, errors)
    first = asyncio.create_task(r.decide("prom-token", "get", "/metrics"))
    storm = [asyncio.create_task(r.decide("prom-token", "get", "/metrics")) for _ in range(100)]
    async with asyncio.timeout(5):
        while not api.calls:  # noqa: ASYNC110 - the review task starts on the next loop turn
            await asyncio.sleep(0)
    first.cancel()  # the scraper that started the review hangs up
    api.hold.set()
    decisions = await asyncio.gather(*storm)
    assert {d.status for d in decisions} == {200}
    assert api.token_reviews() == 1


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (OSError("connection refused"), "api_error"),
        (RuntimeError("POST /apis/...: HTTP 403: forbidden"), "api_error"),
        ("malformed", "malformed_response"),
        ("slow", "timeout"),
    ],
)
async def test_a_failed_review_denies_with_503_counted_and_never_cached(failure: Any, kind: str) -> None:
    api, errors = FakeApi(), list[str]()
    if failure == "malformed":
        api.answer = {"status": {"authenticated": "perhaps", "user": 7}}
    elif failure == "slow":
        api.hold = asyncio.Event()  # never set: the review's own timeout ends it
    else:
        api.fail = failure
    r = reviewer(api, errors, timeout_seconds=0.05)
    assert (await r.decide("prom-token", "get", "/metrics")).status == 503
    assert errors == [kind]
    api.fail = api.answer = api.hold = None
    assert (await r.decide("prom-token", "get", "/metrics")).status == 200


# -- the middleware -------------------------------------------------------------------------------


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _app(cfg: AuthConfig, api: FakeApi, errors: list[str]) -> web.Application:
    g = guard(cfg, on_error=errors.append, supervisor=Supervisor(delay=lambda deaths: 1.0), api=api)
    app = web.Application(middlewares=[g.middleware])
    app.cleanup_ctx.append(g.lifespan)
    for path in ("/metrics", "/healthz", "/readyz", "/api/v1/faults"):
        app.router.add_get(path, _ok)
    app.router.add_post("/api/v1/faults", _ok)
    return app


async def test_kubernetes_mode_over_http(aiohttp_client: MakeClient) -> None:
    api, errors = FakeApi(), list[str]()
    client = await aiohttp_client(_app(AuthConfig(mode="kubernetes"), api, errors))

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    for headers in ({}, {"Authorization": "Basic cHJvbTpzM2NyZXQ="}, bearer(""), bearer("forged")):
        resp = await client.get("/metrics", headers=headers)
        assert resp.status == 401 and resp.headers["WWW-Authenticate"] == 'Bearer realm="gpumon"'
    assert (await client.get("/metrics", headers=bearer("prom-token"))).status == 200
    # Under /api/ (which every authenticated user may read on the API server) the review asks
    # for /gpumon/api/...
    resp = await client.get("/api/v1/faults", headers=bearer("prom-token"))
    assert resp.status == 403 and "may not get /gpumon/api/v1/faults" in await resp.text()
    api.grants.add(("system:serviceaccount:monitoring:prometheus", "get", "/gpumon/api/v1/faults"))
    # POST is `create`: a grant to read is no grant to inject faults.
    assert (await client.post("/api/v1/faults", headers=bearer("prom-token"))).status == 403
    # The probes stay open; nothing about them reaches the API server.
    calls = len(api.calls)
    assert [(await client.get(p)).status for p in ("/healthz", "/readyz")] == [200, 200]
    assert len(api.calls) == calls
    api.fail = OSError("unreachable")
    resp = await client.get("/metrics", headers=bearer("someone-new"))
    assert resp.status == 503 and resp.headers["Retry-After"]
    assert errors == ["api_error"]


def test_kubernetes_mode_takes_no_static_credentials(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="for mode static only"):
        AuthConfig(mode="kubernetes", bearer_token_file=tmp_path / "t")


# -- TLS ------------------------------------------------------------------------------------------


def test_controller_server_tls_and_its_errors_name_the_field(tmp_path: Path) -> None:
    missing = tmp_path / "cert.pem"
    cfg = ControllerConfig.model_validate({"tls": {"cert_file": missing, "key_file": tmp_path / "key.pem"}})
    with pytest.raises(ConfigError, match=r"tls\.cert_file: cannot read certificate"):
        server_context(cfg.tls)
    assert server_context(TlsConfig()) is None


def test_ca_file_errors_name_the_field(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"signals\.direct\.ca_file: cannot load .*no PEM certificate"):
        client_context(garbage, "signals.direct.ca_file")


async def test_a_dying_token_reload_is_logged_counted_and_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue #18: the reload task caught only ConfigError; anything else ended it silently and
    # the token was never re-read again (a rotated token then locked every scraper out).
    token = tmp_path / "token"
    token.write_text("one\n")
    monkeypatch.setattr(guard_module, "TOKEN_RELOAD_SECONDS", 0.01)
    restarts: list[str] = []
    supervisor = Supervisor(delay=lambda deaths: 0.01, on_restart=restarts.append)
    g = guard(AuthConfig(bearer_token_file=token), on_error=lambda kind: None, supervisor=supervisor)
    calls = 0
    read = static_module.read_config_bytes

    def broken_once(path: Path, what: str) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("a bug of ours")
        return read(path, what)

    monkeypatch.setattr(static_module, "read_config_bytes", broken_once)
    caplog.set_level(logging.ERROR, logger="gpumon.runtime.tasks")
    lifespan = g.lifespan(web.Application())
    await anext(lifespan)
    try:
        token.write_text("two\n")
        async with asyncio.timeout(10):
            while g.static.token != b"two":  # noqa: ASYNC110 - the reload runs on its own cadence
                await asyncio.sleep(0.01)
    finally:
        with contextlib.suppress(StopAsyncIteration):
            await anext(lifespan)
    assert restarts == ["gpumon-token-reload"]
    assert [
        r.exc_info is not None for r in caplog.records if r.getMessage().startswith("background task died")
    ] == [True]
    assert supervisor.restarting()[0].error == "OSError: a bug of ours"

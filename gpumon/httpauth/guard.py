"""The one middleware both servers use: static credentials or Kubernetes delegation.

The probes (``/healthz``, ``/readyz``, exact paths) stay open: the kubelet calls them without
credentials, and they say only whether the process is alive and ready (docs/security.md says
why they are not moved to a port of their own). Everything else, routes added later included,
needs credentials whenever auth is configured."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from gpumon.config import AuthConfig
from gpumon.config.files import ConfigError
from gpumon.httpauth.kubernetes import KubernetesReviewer, ReviewApi, connect_reviews, verb_of
from gpumon.httpauth.static import Authenticator, authenticator
from gpumon.runtime.tasks import Supervisor, cancel_and_wait

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
TOKEN_RELOAD_SECONDS = 30.0
_BEARER_CHALLENGE = 'Bearer realm="gpumon"'


class Guard:
    """Build with :func:`guard`; put :meth:`middleware` on the app and :meth:`lifespan` in its
    ``cleanup_ctx`` (the token file's reload, the Kubernetes client's life). The reload runs
    under the program's ``supervisor``: if it dies it is logged, counted and restarted."""

    def __init__(
        self, static: Authenticator, reviewer: KubernetesReviewer | None, supervisor: Supervisor
    ) -> None:
        self.static = static
        self.reviewer = reviewer
        self._supervisor = supervisor

        # A function, marked: aiohttp takes anything unmarked for an old-style factory.
        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path not in OPEN_PATHS:
                refusal = await self._refusal(request)
                if refusal is not None:
                    return refusal
            return await handler(request)

        self.middleware = middleware

    async def _refusal(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        if self.reviewer is None:
            if not self.static.enabled or self.static.allows(header):
                return None
            return _unauthorized(self.static.challenge())
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _unauthorized(_BEARER_CHALLENGE)
        decision = await self.reviewer.decide(token, verb_of(request.method), request.path)
        if decision.allowed:
            return None
        if decision.status == 401:
            return _unauthorized(_BEARER_CHALLENGE)
        headers = {"Retry-After": "5"} if decision.status == 503 else {}
        return web.Response(status=decision.status, text=decision.reason + "\n", headers=headers)

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if self.static.token_file is not None:
                task = self._supervisor.start("gpumon-token-reload", self._reload_forever)
                stack.push_async_callback(cancel_and_wait, [task])
            if self.reviewer is not None:
                if self.reviewer.api is None:
                    self.reviewer.api = await stack.enter_async_context(connect_reviews())
                stack.push_async_callback(self.reviewer.close)
            yield

    async def _reload_forever(self) -> None:
        while True:
            await asyncio.sleep(TOKEN_RELOAD_SECONDS)
            try:
                await asyncio.to_thread(self.static.reload_token)
            except ConfigError as e:
                # A file being rotated or unreadable for a while: expected, the old token holds.
                # Anything else is a bug of ours and ends the task, for the supervisor to report.
                log.error("keeping the previous bearer token: %s", e)


def _unauthorized(challenge: str) -> web.Response:
    return web.Response(status=401, text="unauthorized\n", headers={"WWW-Authenticate": challenge})


def guard(
    cfg: AuthConfig,
    *,
    on_error: Callable[[str], None],
    supervisor: Supervisor,
    api: ReviewApi | None = None,
) -> Guard:
    """From config: a bad token file is a configuration error now. With ``auth.mode:
    kubernetes``, reviews go through ``api`` (the controller's client), else through a client
    :meth:`Guard.lifespan` opens from the pod's service account or the kubeconfig."""
    reviewer = None
    if cfg.mode == "kubernetes":
        reviewer = KubernetesReviewer(cfg.kubernetes, on_error=on_error, api=api)
    return Guard(authenticator(cfg), reviewer, supervisor)

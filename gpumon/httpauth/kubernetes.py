"""Scrape authorization delegated to the API server (``auth.mode: kubernetes``).

As kube-rbac-proxy and controller-runtime's metrics filter
(``filters.WithAuthenticationAndAuthorization``) do it: the caller's bearer token goes to a
TokenReview (authentication.k8s.io/v1), and the user it names is checked with a
SubjectAccessReview (authorization.k8s.io/v1) for the request path as a non-resource URL with
the verb of the request's method (paths under /api/ as /gpumon/api/...: :func:`review_path`).
Prometheus then needs only a ClusterRole with ``get`` on ``nonResourceURLs: ["/metrics"]``;
the server itself needs ``system:auth-delegator``.

Decisions (allowed, unauthenticated, forbidden) are kept for a short TTL in a bounded LRU, and
concurrent requests for the same token, verb and path share one review, so a scrape storm costs
the API server at most one pair of reviews per key and TTL. A review that fails (API server
unreachable or slow, the reviews refused, an answer of the wrong shape) denies with 503 and is
counted: never allowed, never cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpumon.config import KubernetesAuthConfig
from gpumon.config.files import ConfigError
from gpumon.kube.client import KubeClient
from gpumon.kube.credentials import CredentialsError, load_credentials
from gpumon.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

# kube-rbac-proxy's mapping of methods to verbs; HEAD reads what GET reads.
_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


def verb_of(method: str) -> str:
    return _VERBS.get(method.upper(), method.lower())


# The API server's default role system:discovery lets every authenticated user get /api/* and
# /apis/* (its own discovery paths). Reviewed as they are, the exporter's /api/v1/... would be
# open to any ServiceAccount token in the cluster; so they are reviewed under this prefix.
REVIEW_PREFIX = "/gpumon"
_DISCOVERY = ("/api", "/apis")


def review_path(path: str) -> str:
    """The non-resource URL a request's path is reviewed as."""
    if any(path == d or path.startswith(d + "/") for d in _DISCOVERY):
        return REVIEW_PREFIX + path
    return path


class ReviewApi(Protocol):
    """POST a JSON object to an API path, returning the JSON answer; raises on any failure
    (transport, timeout, an HTTP error status). gpumon.kube.client's ``KubeApi`` is one."""

    async def post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200 allowed, 401 unauthenticated, 403 forbidden, 503 no decision
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


_UNAVAILABLE = Decision(503, "authorization unavailable")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class _User(_Frozen):
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = Field(default_factory=dict)


class _TokenStatus(_Frozen):
    authenticated: bool = False
    user: _User | None = None
    error: str = ""


class _TokenReview(_Frozen):
    status: _TokenStatus = _TokenStatus()


class _AccessStatus(_Frozen):
    allowed: bool = False
    reason: str = ""


class _AccessReview(_Frozen):
    status: _AccessStatus


Key = tuple[bytes, str, str]


class KubernetesReviewer:
    """Decides requests by TokenReview + SubjectAccessReview, cached; ``api`` may be set late
    (see :func:`connect_reviews`). ``on_error`` counts failed reviews by kind."""

    def __init__(
        self,
        settings: KubernetesAuthConfig,
        *,
        on_error: Callable[[str], None],
        api: ReviewApi | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self._settings = settings
        self._on_error = on_error
        self._clock = clock
        self._cache: OrderedDict[Key, tuple[float, Decision]] = OrderedDict()
        self._inflight: dict[Key, asyncio.Task[Decision]] = {}

    async def decide(self, token: str, verb: str, path: str) -> Decision:
        path = review_path(path)
        # Tokens are kept hashed: the cache never holds a usable credential.
        key = (hashlib.sha256(token.encode()).digest(), verb, path)
        hit = self._cache.get(key)
        if hit is not None:
            if self._clock() < hit[0]:
                self._cache.move_to_end(key)
                return hit[1]
            del self._cache[key]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._review(token, verb, path), name="gpumon-access-review")
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._settle(key, t))
        # Shielded: a scraper that hangs up must not cancel the review others are waiting for.
        return await asyncio.shield(task)

    def _settle(self, key: Key, task: asyncio.Task[Decision]) -> None:
        del self._inflight[key]
        if task.cancelled():
            return
        decision = task.result()
        ttl = self._settings.cache_ttl_seconds
        if decision is _UNAVAILABLE or ttl <= 0:
            return
        self._cache[key] = (self._clock() + ttl, decision)
        while len(self._cache) > self._settings.cache_max_entries:
            self._cache.popitem(last=False)

    async def _review(self, token: str, verb: str, path: str) -> Decision:
        try:
            async with asyncio.timeout(self._settings.timeout_seconds):
                return await self._ask(token, verb, path)
        except TimeoutError:
            kind = "timeout"
        except ValidationError:
            kind = "malformed_response"
        except Exception as e:  # any failure of the API call denies
            log.warning("access review failed: %s", str(e)[:300])
            kind = "api_error"
        self._on_error(kind)
        return _UNAVAILABLE

    async def _ask(self, token: str, verb: str, path: str) -> Decision:
        api = self.api
        if api is None:
            raise RuntimeError("no API client yet")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = _TokenReview.model_validate(await api.post(TOKEN_REVIEWS, body)).status
        if not status.authenticated or status.user is None:
            return Decision(401, "token not accepted" + (f": {status.error}" if status.error else ""))
        user = status.user
        spec = {
            "user": user.username,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra.items()},
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        access = _AccessReview.model_validate(await api.post(ACCESS_REVIEWS, review)).status
        if access.allowed:
            return Decision(200, "allowed")
        return Decision(403, f"{user.username} may not {verb} {path}")

    async def close(self) -> None:
        await cancel_and_wait(list(self._inflight.values()))


@asynccontextmanager
async def connect_reviews() -> AsyncIterator[ReviewApi]:
    """An API client for a process that has none of its own (the exporter): the pod's service
    account, else $KUBECONFIG or ~/.kube/config (:mod:`gpumon.kube.credentials`)."""
    try:
        credentials = load_credentials()
    except CredentialsError as e:
        raise ConfigError(f"auth.mode: kubernetes needs credentials for the API server: {e}") from None
    async with KubeClient(credentials, connections=4) as api:
        yield api

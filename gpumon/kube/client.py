"""The one client of the Kubernetes API in gpumon, for every program: raw JSON over plain aiohttp.

Answers are read as plain JSON, never turned into generated model objects, so that caches stay
small and fast (each caller keeps a slim view of what it reads). Errors are typed once, by HTTP
status: :class:`NotFound` (404), :class:`Conflict` (409), :class:`Gone` (410),
:class:`TooManyRequests` (429), :class:`KubeError` for any other, and :class:`Unreachable` for
a transport failure or a timeout. Credentials come from :mod:`gpumon.kube.credentials`.

Why not the generated client (kubernetes_asyncio), measured by ``python -m bench.kube_client``
(figures and decision in docs/decisions.md, "One way to the Kubernetes API"): a process that
imports aiohttp and this module holds 42.9 MiB, one that imports aiohttp and the generated
client with its config loader 72.1 MiB, a cost the exporter would pay on every GPU node; and a
GET costs 331 µs of client CPU here against 902 µs through its ``ApiClient.call_api``. Nothing
in gpumon/ imports it (an import contract); the tests keep it as a client of the API server
independent of this one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from gpumon.config.files import field_error
from gpumon.kube.credentials import Credentials, CredentialsError, load_credentials
from gpumon.runtime.gcpause import gc_paused

Json = dict[str, Any]


class KubeError(Exception):
    def __init__(
        self, status: int, reason: str, message: str = "", body: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: Mapping[str, Any] = body or {}


class Unreachable(KubeError):
    """No answer: the connection failed, broke, or timed out (``timed_out``)."""

    def __init__(self, detail: str, *, timed_out: bool = False) -> None:
        super().__init__(0, "Unreachable", detail)
        self.timed_out = timed_out


class Conflict(KubeError):
    pass


class NotFound(KubeError):
    pass


class TooManyRequests(KubeError):
    pass


class Gone(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 429: TooManyRequests}


def error_for(status: int, body: Mapping[str, Any]) -> KubeError:
    cls = _BY_STATUS.get(status, KubeError)
    return cls(status, str(body.get("reason", "")), str(body.get("message", "")), body)


_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 410: "expired"}


def error_kind(exc: BaseException) -> str:
    """A short error-metric kind for a failed call: ``unauthorized``, ``forbidden``,
    ``not_found``, ``expired``, ``http_<status>``, ``unreachable``, ``timeout`` or
    ``malformed_response`` (an answer of the wrong shape)."""
    if isinstance(exc, Unreachable):
        return "timeout" if exc.timed_out else "unreachable"
    if isinstance(exc, KubeError):
        return _KINDS.get(exc.status, f"http_{exc.status}")
    if isinstance(exc, ValueError | KeyError | TypeError | AttributeError):
        return "malformed_response"
    return "error"


class KubeApi(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Json: ...

    async def post(self, path: str, body: Mapping[str, Any]) -> Json: ...

    async def put(self, path: str, body: Mapping[str, Any]) -> Json: ...

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> Json:
        """JSON merge patch, or a strategic merge patch (lists merged by key, e.g. conditions)."""

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> Json: ...

    def lines(
        self, path: str, params: Mapping[str, str], *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[bytes]:
        """A streaming GET (``watch=1``), one line per item (its newline kept), until the server
        closes it; ``opened()`` is called once the server has answered 2xx."""


@contextmanager
def _unreachable(what: str) -> Iterator[None]:
    """A transport failure or timeout as :class:`Unreachable`."""
    try:
        yield
    except TimeoutError as e:
        raise Unreachable(f"{what}: {e!r}", timed_out=True) from None
    except (aiohttp.ClientError, OSError) as e:
        raise Unreachable(f"{what}: {e!r}") from None


_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"


class KubeClient:
    """:class:`KubeApi` on one aiohttp connection pool; close it (``async with``) when done.

    ``connections`` bounds the pool: each open watch holds one connection for its length."""

    def __init__(
        self, credentials: Credentials, *, request_timeout: float = 30.0, connections: int = 100
    ) -> None:
        self.credentials = credentials
        self._timeout = request_timeout
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the loop that uses it
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl or False, limit=self._connections),
                headers={"Accept": "application/json", "User-Agent": "gpumon"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        bounds: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        try:
            headers = await self.credentials.authorization()
        except (CredentialsError, OSError) as e:
            raise KubeError(401, "NoCredentials", str(e)) from None
        if body is not None:
            headers["Content-Type"] = content_type
        with _unreachable(f"{method} {path}"):
            resp = await self._open().request(
                method,
                self.credentials.server + path,
                params=params,
                data=None if body is None else json.dumps(body),
                headers=headers,
                timeout=bounds or aiohttp.ClientTimeout(total=self._timeout),
            )
        if resp.status >= 400:
            try:
                raw = await resp.read()
            except (TimeoutError, aiohttp.ClientError):
                raw = b""
            finally:
                resp.release()
            try:
                err_body = json.loads(raw) if raw else {}
            except ValueError:
                err_body = {"message": raw[:300].decode(errors="replace")}
            raise error_for(resp.status, err_body if isinstance(err_body, dict) else {})
        return resp

    async def _json(self, method: str, path: str, **kw: Any) -> Json:
        resp = await self._call(method, path, **kw)
        try:
            with _unreachable(f"{method} {path}"):
                raw = await resp.read()
        finally:
            resp.release()
        with gc_paused():
            data = json.loads(raw) if raw else {}
        if not isinstance(data, dict):
            raise ValueError(f"{method} {path}: the answer is no JSON object")
        return data

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Json:
        return await self._json("GET", path, params=params)

    async def post(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self._json("POST", path, body=body)

    async def put(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self._json("PUT", path, body=body)

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> Json:
        return await self._json("PATCH", path, body=body, content_type=_STRATEGIC if strategic else _MERGE)

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> Json:
        return await self._json("DELETE", path, body=body)

    async def lines(
        self, path: str, params: Mapping[str, str], *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[bytes]:
        # Connecting is bounded by the request timeout; a watch asked to end after
        # timeoutSeconds has that long and the request timeout again (one timer, not one per
        # read): past it the connection is taken for dead.
        lasts = params.get("timeoutSeconds", "")
        total = int(lasts) + self._timeout if lasts.isdigit() else None
        bounds = aiohttp.ClientTimeout(total=total, sock_connect=self._timeout)
        resp = await self._call("GET", path, params=params, bounds=bounds)
        if opened is not None:
            opened()
        pending = b""
        try:
            with _unreachable(f"watch {path}"):
                # Lines of any length, split from the chunks as they come.
                async for chunk in resp.content.iter_any():
                    pending += chunk
                    start = 0
                    while (end := pending.find(b"\n", start)) != -1:
                        line, start = pending[start : end + 1], end + 1
                        if line.strip():
                            yield line
                    pending = pending[start:]
        finally:
            resp.release()
        if pending.strip():
            yield pending


def connect(kubeconfig: Path | None = None, context: str | None = None, **options: Any) -> KubeClient:
    """A client from ``kubeconfig`` if given, else the pod's service account, else $KUBECONFIG
    or ~/.kube/config; ``options`` go to :class:`KubeClient`.

    Credentials that cannot be used are a :class:`~gpumon.config.files.ConfigError` naming the
    field ``kubeconfig``. Nothing here talks to the API server: an unreachable one is found (and
    survived) later."""
    try:
        credentials = load_credentials(kubeconfig=kubeconfig, context=context)
    except CredentialsError as e:
        raise field_error("kubeconfig", str(e)) from None
    return KubeClient(credentials, **options)


@asynccontextmanager
async def connected(
    kubeconfig: Path | None = None, context: str | None = None, **options: Any
) -> AsyncIterator[KubeClient]:
    async with connect(kubeconfig, context, **options) as api:
        yield api

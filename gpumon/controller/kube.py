"""The one narrow interface between the controller and the API server: raw JSON over HTTP.

kubernetes_asyncio does the connection work (kubeconfig or in-cluster credentials, TLS,
token refresh); responses are read as plain JSON, never turned into generated model objects,
so that caches stay small and fast. Errors are typed by status: :class:`Conflict` (409),
:class:`NotFound` (404), :class:`TooManyRequests` (429), :class:`Gone` (410), and
:class:`Unreachable` for transport failures.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from gpumon.configfile import ConfigError, field_error, read_yaml_mapping
from gpumon.gcpause import gc_paused

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
    def __init__(self, detail: str) -> None:
        super().__init__(0, "Unreachable", detail)


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


class KubeApi(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Json: ...

    async def post(self, path: str, body: Mapping[str, Any]) -> Json: ...

    async def put(self, path: str, body: Mapping[str, Any]) -> Json: ...

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> Json:
        """JSON merge patch, or a strategic merge patch (lists merged by key, e.g. conditions)."""

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> Json: ...

    def lines(self, path: str, params: Mapping[str, str]) -> AsyncIterator[bytes]:
        """A streaming GET (``watch=1``), one line per item, until the server closes it."""


class ApiClientKube:
    """:class:`KubeApi` over a kubernetes_asyncio ``ApiClient``."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0) -> None:
        self._client = api_client
        self._timeout = request_timeout

    async def close(self) -> None:
        await self._client.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        request_timeout: Any = None,
    ) -> aiohttp.ClientResponse:
        try:
            resp: aiohttp.ClientResponse = await self._client.call_api(
                path,
                method,
                query_params=list((params or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=request_timeout if request_timeout is not None else self._timeout,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise Unreachable(f"{method} {path}: {e!r}") from None
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
                err_body = {"message": raw[:200].decode(errors="replace")}
            raise error_for(resp.status, err_body if isinstance(err_body, dict) else {})
        return resp

    async def _json(self, method: str, path: str, **kw: Any) -> Json:
        resp = await self._call(method, path, **kw)
        try:
            raw = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise Unreachable(f"{method} {path}: {e!r}") from None
        finally:
            resp.release()
        with gc_paused():
            data = json.loads(raw) if raw else {}
        return data if isinstance(data, dict) else {}

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Json:
        return await self._json("GET", path, params=params)

    async def post(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self._json("POST", path, body=body)

    async def put(self, path: str, body: Mapping[str, Any]) -> Json:
        return await self._json("PUT", path, body=body)

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> Json:
        kind = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        return await self._json("PATCH", path, body=body, content_type=kind)

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> Json:
        return await self._json("DELETE", path, body=body)

    async def lines(self, path: str, params: Mapping[str, str]) -> AsyncIterator[bytes]:
        # The server ends a watch after its timeoutSeconds; only connecting is bounded here.
        timeout = aiohttp.ClientTimeout(connect=self._timeout, sock_connect=self._timeout)
        resp = await self._call("GET", path, params=params, request_timeout=timeout)
        try:
            while True:
                try:
                    line = await resp.content.readline()
                except (TimeoutError, aiohttp.ClientError) as e:
                    raise Unreachable(f"watch {path}: {e!r}") from None
                if not line:
                    return
                yield line
        finally:
            resp.release()


class _Named(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str


class _KubeconfigShape(BaseModel):
    """Only what the library indexes without checking (it fails with a bare TypeError)."""

    model_config = ConfigDict(extra="allow")

    clusters: list[_Named] | None = None
    contexts: list[_Named] | None = None
    users: list[_Named] | None = None


def _check_kubeconfig(path: Path) -> None:
    data = read_yaml_mapping(path, "kubeconfig", allow_empty=False)
    try:
        _KubeconfigShape.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        at = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"kubeconfig {path} is not usable: {at}: {first['msg']}") from None


def _default_kubeconfig() -> tuple[str, Path | None]:
    """$KUBECONFIG or ~/.kube/config, and the one file to check (none when $KUBECONFIG lists
    several, which the library merges: those it checks alone)."""
    from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

    location = str(KUBE_CONFIG_DEFAULT_LOCATION)
    return location, Path(os.path.expanduser(location)) if os.pathsep not in location else None


async def connect(kubeconfig: Path | None = None, context: str | None = None) -> ApiClientKube:
    """Credentials from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else in-cluster.

    A kubeconfig that cannot be used is a :class:`ConfigError` naming it and the field
    ``kubeconfig``. Nothing here talks to the API server: an unreachable one is found (and
    survived) later."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    path, location, why = kubeconfig, str(kubeconfig), ""
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return ApiClientKube(client.ApiClient(configuration))
        except config.ConfigException:
            location, path = _default_kubeconfig()
            why = "not in a cluster, and "
    try:
        if path is not None:
            # Through the config reader first: the library would log a missing file and then
            # fail with a TypeError, and would block on a FIFO.
            _check_kubeconfig(path)
        await config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            context=context,
            client_configuration=configuration,
        )
    except ConfigError as e:
        raise field_error("kubeconfig", f"{why}{e}") from None
    except (config.ConfigException, TypeError, ValueError, KeyError, AttributeError) as e:
        # The library's messages start "Invalid kube-config file."; the rest says what is wrong.
        detail = str(e).removeprefix("Invalid kube-config file.").strip() or type(e).__name__
        raise field_error("kubeconfig", f"{why}kubeconfig {location} is not usable: {detail}") from None
    return ApiClientKube(client.ApiClient(configuration))


@asynccontextmanager
async def connected(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[ApiClientKube]:
    api = await connect(kubeconfig, context)
    try:
        yield api
    finally:
        await api.close()

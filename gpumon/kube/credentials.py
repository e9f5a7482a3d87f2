"""Where gpumon finds its credentials for the API server: the one reader, for every program.

In client-go's order: the pod's service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the
token and CA mounted under ``/var/run/secrets/kubernetes.io/serviceaccount``), else a
kubeconfig: the one given, else the files of ``$KUBECONFIG`` merged (the first file to name a
cluster, context or user wins, as client-go merges them), else ``~/.kube/config``. From the
kubeconfig, the current context (or the one asked for): ``server``,
``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``tls-server-name``,
``token``/``tokenFile``, ``client-certificate(-data)``/``client-key(-data)`` and ``exec``
plugins (``client.authentication.k8s.io``, the way EKS, GKE and AKS kubeconfigs log in: the
token is cached until its expiry, then the plugin runs again). Legacy ``auth-provider`` entries
(removed from kubectl in 1.26) and basic auth are refused with a message saying so.

A token file is read again for every request: the kubelet rotates bound service account
tokens in place. A kubeconfig is read through :mod:`gpumon.configfile`, so a FIFO, a directory,
a huge file, non-UTF-8 text or a repeated key are refused like any config file; every failure
is a :class:`CredentialsError` (a :class:`~gpumon.configfile.ConfigError`) saying which file
and what in it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpumon.configfile import ConfigError, read_yaml_mapping

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A plugin's token is asked for again this long before the expiry it gave.
EXEC_EXPIRY_MARGIN_SECONDS = 60.0
EXEC_TIMEOUT_SECONDS = 60.0


class CredentialsError(ConfigError):
    """No usable credentials: one line for people."""


# -- the kubeconfig's shape ------------------------------------------------------------------------


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class _Cluster(_Shape):
    server: str
    certificate_authority: str | None = Field(None, alias="certificate-authority")
    certificate_authority_data: str | None = Field(None, alias="certificate-authority-data")
    insecure_skip_tls_verify: bool = Field(False, alias="insecure-skip-tls-verify")
    tls_server_name: str | None = Field(None, alias="tls-server-name")


class _EnvVar(_Shape):
    name: str
    value: str


class _Exec(_Shape):
    command: str
    api_version: str = Field(alias="apiVersion")
    args: tuple[str, ...] = ()
    env: tuple[_EnvVar, ...] | None = None


class _User(_Shape):
    token: str | None = None
    token_file: str | None = Field(None, alias="tokenFile")
    client_certificate: str | None = Field(None, alias="client-certificate")
    client_certificate_data: str | None = Field(None, alias="client-certificate-data")
    client_key: str | None = Field(None, alias="client-key")
    client_key_data: str | None = Field(None, alias="client-key-data")
    exec_: _Exec | None = Field(None, alias="exec")
    auth_provider: dict[str, Any] | None = Field(None, alias="auth-provider")
    username: str | None = None


class _Context(_Shape):
    cluster: str
    user: str = ""


class _NamedCluster(_Shape):
    name: str
    cluster: _Cluster


class _NamedUser(_Shape):
    name: str
    user: _User = _User()


class _NamedContext(_Shape):
    name: str
    context: _Context


class _Kubeconfig(_Shape):
    current_context: str = Field("", alias="current-context")
    clusters: tuple[_NamedCluster, ...] | None = None
    contexts: tuple[_NamedContext, ...] | None = None
    users: tuple[_NamedUser, ...] | None = None


# -- credentials -------------------------------------------------------------------------------------


@dataclass(slots=True)
class ExecPlugin:
    """A kubeconfig's ``exec`` entry: a command printing an ExecCredential with a token."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    api_version: str
    cwd: Path
    _token: str = ""
    _expires: float = 0.0  # time.time(); 0 with a token: never

    async def token(self, wall_clock: float) -> str:
        if self._token and (self._expires == 0 or wall_clock < self._expires - EXEC_EXPIRY_MARGIN_SECONDS):
            return self._token
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command,
                *self.args,
                cwd=self.cwd,
                env={**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(EXEC_TIMEOUT_SECONDS):
                out, err = await proc.communicate()
        except (OSError, TimeoutError) as e:
            raise CredentialsError(
                f"the kubeconfig's exec plugin {self.command!r} did not run: {e}"
            ) from None
        if proc.returncode != 0:
            detail = err.decode(errors="replace").strip()[-300:]
            raise CredentialsError(
                f"the kubeconfig's exec plugin {self.command!r} failed (exit {proc.returncode}): {detail}"
            )
        self._token, self._expires = _exec_status(self.command, out)
        return self._token


def _exec_status(command: str, out: bytes) -> tuple[str, float]:
    try:
        status = json.loads(out)["status"]
        token = status["token"]
        expiry = status.get("expirationTimestamp")
        if not isinstance(token, str) or not token:
            raise TypeError("no token")
        expires = datetime.fromisoformat(expiry.replace("Z", "+00:00")).timestamp() if expiry else 0.0
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CredentialsError(
            f"the kubeconfig's exec plugin {command!r} printed no ExecCredential with a token "
            f"(plugins that answer with client certificates are not supported): {e!r}"
        ) from None
    return token, expires


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str  # scheme://host:port, no trailing slash
    ssl: ssl.SSLContext | None  # None for plain http
    token: str | None = None
    token_file: Path | None = None
    exec_plugin: ExecPlugin | None = field(default=None, compare=False)
    source: str = ""  # for messages: "the pod's service account" or "kubeconfig <path>"

    def headers(self) -> dict[str, str]:
        """The Authorization header of a static token or a token file (read now); an exec
        plugin's token is only had through :meth:`authorization`."""
        token = self.token
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def authorization(self) -> dict[str, str]:
        """The header for the next request; raises :class:`CredentialsError` or OSError."""
        if self.exec_plugin is not None:
            return {"Authorization": f"Bearer {await self.exec_plugin.token(time.time())}"}
        return self.headers()


def in_cluster(
    env: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> Credentials | None:
    """The pod's service account, or None outside a pod (client-go's ``InClusterConfig``)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token = account_dir / "token"
    if not host or not port or not token.is_file():
        return None
    try:
        context = ssl.create_default_context(cafile=str(account_dir / "ca.crt"))
    except OSError as e:  # ssl.SSLError is one
        raise CredentialsError(f"the service account's CA cannot be loaded: {e}") from None
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    server = f"https://{host}:{port}"
    return Credentials(server, context, token_file=token, source="the pod's service account")


def kubeconfig_paths(env: Mapping[str, str] = os.environ) -> list[Path]:
    """The kubeconfigs client-go reads: the files of ``$KUBECONFIG``, else ``~/.kube/config``."""
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path.home() / ".kube" / "config"]


def _read(path: Path) -> _Kubeconfig:
    try:
        data = read_yaml_mapping(path, "kubeconfig", allow_empty=False)
    except CredentialsError:
        raise
    except ConfigError as e:
        raise CredentialsError(str(e)) from None
    try:
        return _Kubeconfig.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        at = ".".join(str(p) for p in first["loc"])
        raise CredentialsError(f"kubeconfig {path} is not usable: {at}: {first['msg']}") from None


def from_kubeconfig(paths: Path | Sequence[Path], context: str | None = None) -> Credentials:
    """Credentials from one kubeconfig, or several merged; files of a list that do not exist
    are skipped (client-go's rule), unless none does."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    existing = [p for p in paths if p.exists()] if len(paths) > 1 else paths
    docs = [(p, _read(p)) for p in existing or paths[:1]]
    where = ", ".join(str(p) for p, _ in docs)
    try:
        return _credentials(docs, context)
    except CredentialsError:
        raise
    except LookupError as e:
        raise CredentialsError(f"kubeconfig {where} is not usable: {e.args[0]}") from None
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError; bad base64 a ValueError
        raise CredentialsError(f"kubeconfig {where}: its certificates cannot be loaded: {e}") from None


def _merged(docs: Sequence[tuple[Path, _Kubeconfig]], kind: str) -> dict[str, tuple[Path, Any]]:
    """Name -> (the file that defined it first, the entry), as client-go merges."""
    out: dict[str, tuple[Path, Any]] = {}
    for path, doc in docs:
        for entry in getattr(doc, kind) or ():
            out.setdefault(entry.name, (path, entry))
    return out


def _credentials(docs: Sequence[tuple[Path, _Kubeconfig]], context_name: str | None) -> Credentials:
    name = context_name or next((d.current_context for _, d in docs if d.current_context), "")
    if not name:
        raise LookupError("no current-context, and no context asked for")
    contexts, clusters, users = (_merged(docs, kind) for kind in ("contexts", "clusters", "users"))
    if name not in contexts:
        raise LookupError(f"context {name!r} is not defined")
    ctx = contexts[name][1].context
    if ctx.cluster not in clusters:
        raise LookupError(f"context {name!r} names cluster {ctx.cluster!r}, which is not defined")
    if ctx.user and ctx.user not in users:
        raise LookupError(f"context {name!r} names user {ctx.user!r}, which is not defined")
    cluster_file, named_cluster = clusters[ctx.cluster]
    user_file, named_user = users[ctx.user] if ctx.user else (cluster_file, _NamedUser(name=""))
    cluster, user = named_cluster.cluster, named_user.user
    if user.auth_provider is not None or user.username is not None:
        raise CredentialsError(
            f"kubeconfig {user_file}: user {named_user.name!r}: auth providers and basic auth are "
            "not supported (use a token, a client certificate or an exec plugin)"
        )

    def relative(base: Path, value: str | None) -> Path | None:
        # Relative paths in a kubeconfig are relative to the file that holds them.
        return None if value is None else base.parent / value

    server = cluster.server.rstrip("/")
    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https://"):
        context_ssl = _tls(cluster, relative(cluster_file, cluster.certificate_authority))
        _client_certificate(
            context_ssl,
            user,
            relative(user_file, user.client_certificate),
            relative(user_file, user.client_key),
        )
    plugin = None
    if user.exec_ is not None:
        e = user.exec_
        env = {v.name: v.value for v in e.env or ()}
        plugin = ExecPlugin(e.command, e.args, env, e.api_version, user_file.parent)
    return Credentials(
        server,
        context_ssl,
        token=user.token,
        token_file=relative(user_file, user.token_file),
        exec_plugin=plugin,
        source=f"kubeconfig {cluster_file}",
    )


def _tls(cluster: _Cluster, ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.insecure_skip_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.certificate_authority_data is not None:
        context.load_verify_locations(cadata=base64.b64decode(cluster.certificate_authority_data).decode())
    elif ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    return context


def _client_certificate(
    context: ssl.SSLContext, user: _User, cert_file: Path | None, key_file: Path | None
) -> None:
    if user.client_certificate_data is not None or user.client_key_data is not None:
        # ssl loads a certificate chain from files only: a private file, removed once read.
        with tempfile.TemporaryDirectory(prefix="gpumon-kube-") as d:
            cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
            cert.write_bytes(base64.b64decode(user.client_certificate_data or ""))
            key.touch(0o600)
            key.write_bytes(base64.b64decode(user.client_key_data or ""))
            context.load_cert_chain(str(cert), str(key))
    elif cert_file is not None:
        context.load_cert_chain(str(cert_file), None if key_file is None else str(key_file))


def load_credentials(
    env: Mapping[str, str] = os.environ, *, kubeconfig: Path | None = None, context: str | None = None
) -> Credentials:
    """``kubeconfig`` if given, else the pod's service account, else the default kubeconfig;
    raises :class:`CredentialsError`."""
    if kubeconfig is not None:
        return from_kubeconfig(kubeconfig, context)
    found = in_cluster(env)
    if found is not None:
        return found
    try:
        return from_kubeconfig(kubeconfig_paths(env), context)
    except CredentialsError as e:
        raise CredentialsError(f"not in a cluster, and {e}") from None

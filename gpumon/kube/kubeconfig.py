"""Credentials from kubeconfigs (:mod:`gpumon.kube.credentials` says which, and when).

A kubeconfig is read through :mod:`gpumon.config.files`, so a FIFO, a directory, a huge file,
non-UTF-8 text or a repeated key are refused like any config file, then checked against the
shape below; a process in a pod never imports this module (its service account serves), so the
exporter on a node builds none of these models.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpumon.config.files import ConfigError, read_yaml_mapping
from gpumon.kube.credentials import Credentials, CredentialsError, ExecPlugin

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


class _KubeconfigUser(_Shape):
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
    user: _KubeconfigUser = _KubeconfigUser()


class _NamedContext(_Shape):
    name: str
    context: _Context


class _Kubeconfig(_Shape):
    current_context: str = Field("", alias="current-context")
    clusters: tuple[_NamedCluster, ...] | None = None
    contexts: tuple[_NamedContext, ...] | None = None
    users: tuple[_NamedUser, ...] | None = None


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
    context: ssl.SSLContext, user: _KubeconfigUser, cert_file: Path | None, key_file: Path | None
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

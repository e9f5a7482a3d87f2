"""A small client of the Kubernetes API on plain aiohttp, for a process that makes a few requests
of known shape: the exporter's list and watch of its node's pods, and its scrape reviews.

The generated client (kubernetes_asyncio) costs about 34 MiB of resident memory once imported,
more than the rest of the exporter's code and libraries together, and the exporter reads every
answer as raw JSON anyway. The controller keeps the generated client.

Credentials as client-go finds them, in its order: the pod's service account
(``KUBERNETES_SERVICE_HOST``/``_PORT`` and the token and CA mounted under
``/var/run/secrets/kubernetes.io/serviceaccount``), else the current context of the first file in
``$KUBECONFIG`` or ``~/.kube/config``: server, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``token``/``tokenFile``, ``client-certificate(-data)`` and
``client-key(-data)``. Exec plugins and auth providers are not supported and say so. A token
file is read again for every request: the kubelet rotates bound service account tokens in place.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(Exception):
    """No usable credentials: one line for people."""


class ApiStatusError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(f"API server answered HTTP {status}{': ' + detail if detail else ''}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str  # scheme://host:port, no trailing slash
    ssl: ssl.SSLContext | None  # None for plain http
    token: str | None = None
    token_file: Path | None = None
    source: str = ""  # for messages: "the pod's service account" or "kubeconfig <path>"

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


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


def kubeconfig_path(env: Mapping[str, str] = os.environ) -> Path:
    """The kubeconfig client-go reads: the first file in ``$KUBECONFIG``, else ``~/.kube/config``."""
    first = next((p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p), None)
    return Path(first) if first else Path.home() / ".kube" / "config"


def from_kubeconfig(path: Path, context: str | None = None) -> Credentials:
    # Imported here: in a pod the service account serves, and no YAML is read.
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CredentialsError(f"kubeconfig {path} cannot be read: {e}") from None
    try:
        return _credentials(doc, path, context)
    except (KeyError, TypeError, AttributeError, StopIteration) as e:
        raise CredentialsError(f"kubeconfig {path} is not usable: missing or malformed {e}") from None
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError; bad base64 a ValueError
        raise CredentialsError(f"kubeconfig {path}: its certificates cannot be loaded: {e}") from None


def _named(items: Any, name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


def _credentials(doc: Mapping[str, Any], path: Path, context_name: str | None) -> Credentials:
    context = _named(doc["contexts"], context_name or doc["current-context"])["context"]
    cluster = _named(doc["clusters"], context["cluster"])["cluster"]
    user = _named(doc.get("users") or [], context["user"])["user"] if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise CredentialsError(f"kubeconfig {path}: exec plugins and auth providers are not supported")
    base = path.parent

    def file_of(block: Mapping[str, Any], key: str) -> Path | None:
        # Relative paths in a kubeconfig are relative to the file itself.
        return None if block.get(key) is None else base / str(block[key])

    server = str(cluster["server"]).rstrip("/")
    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https://"):
        context_ssl = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            context_ssl.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
        elif (ca := file_of(cluster, "certificate-authority")) is not None:
            context_ssl.load_verify_locations(cafile=str(ca))
        cert, key = file_of(user, "client-certificate"), file_of(user, "client-key")
        _client_certificate(context_ssl, user, cert, key)
    return Credentials(
        server,
        context_ssl,
        token=user.get("token"),
        token_file=file_of(user, "tokenFile"),
        source=f"kubeconfig {path}",
    )


def _client_certificate(
    context: ssl.SSLContext, user: Mapping[str, Any], cert_file: Path | None, key_file: Path | None
) -> None:
    if "client-certificate-data" in user or "client-key-data" in user:
        # ssl loads a certificate chain from files only: a private file, removed once read.
        with tempfile.TemporaryDirectory(prefix="gpumon-kube-") as d:
            cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.touch(0o600)
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(str(cert), str(key))
    elif cert_file is not None:
        context.load_cert_chain(str(cert_file), None if key_file is None else str(key_file))


def load_credentials(env: Mapping[str, str] = os.environ) -> Credentials:
    """The pod's service account, else the kubeconfig; raises :class:`CredentialsError`."""
    found = in_cluster(env)
    if found is not None:
        return found
    path = kubeconfig_path(env)
    if not path.is_file():
        raise CredentialsError(f"not in a pod (no service account token) and no kubeconfig at {path}")
    return from_kubeconfig(path)


class KubeClient:
    """One connection pool to the API server; close it (``async with``) when done."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the loop that uses it
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl or False, limit=4),
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

    def get(
        self, path: str, params: Mapping[str, str], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.client._RequestContextManager:
        """``async with client.get(...) as resp``: the raw response, streamed, any status."""
        return self._open().get(
            self.credentials.server + path, params=params, timeout=timeout, headers=self.credentials.headers()
        )

    async def post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST a JSON object, return the JSON object answered; raises :class:`ApiStatusError` on an
        error status and ValueError on an answer that is no JSON object (``ReviewApi``)."""
        async with self._open().post(
            self.credentials.server + path,
            json=body,
            timeout=aiohttp.ClientTimeout(total=30),
            headers=self.credentials.headers(),
        ) as resp:
            if resp.status >= 400:
                raise ApiStatusError(resp.status, (await resp.text(errors="replace"))[:300])
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise ValueError(f"POST {path}: not a JSON object")
        return data

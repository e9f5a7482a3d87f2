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
tokens in place. Kubeconfigs are read by :mod:`gpumon.kube.kubeconfig` (imported only when one
is); every failure is a :class:`CredentialsError` (a :class:`~gpumon.config.files.ConfigError`)
saying which file and what in it.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gpumon.config.files import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A plugin's token is asked for again this long before the expiry it gave.
EXEC_EXPIRY_MARGIN_SECONDS = 60.0
EXEC_TIMEOUT_SECONDS = 60.0


class CredentialsError(ConfigError):
    """No usable credentials: one line for people."""


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


def load_credentials(
    env: Mapping[str, str] = os.environ, *, kubeconfig: Path | None = None, context: str | None = None
) -> Credentials:
    """``kubeconfig`` if given, else the pod's service account, else the default kubeconfig;
    raises :class:`CredentialsError`."""
    # Imported here: in a pod the service account serves, and no kubeconfig model is built.
    from gpumon.kube.kubeconfig import from_kubeconfig, kubeconfig_paths

    if kubeconfig is not None:
        return from_kubeconfig(kubeconfig, context)
    found = in_cluster(env)
    if found is not None:
        return found
    try:
        return from_kubeconfig(kubeconfig_paths(env), context)
    except CredentialsError as e:
        raise CredentialsError(f"not in a cluster, and {e}") from None

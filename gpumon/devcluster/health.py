"""Probes of the components' health endpoints, over TLS verified against the cluster CA."""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from gpumon.devcluster.components import HealthCheck


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Prober:
    ca_cert: Path
    client_cert: Path
    client_key: Path
    timeout_seconds: float = 2.0

    def _context(self, with_client_cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        if with_client_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def probe(self, check: HealthCheck) -> ProbeResult:
        url = urllib.parse.urlsplit(check.url)
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(
                url.netloc, timeout=self.timeout_seconds, context=self._context(check.client_cert)
            )
        else:
            conn = http.client.HTTPConnection(url.netloc, timeout=self.timeout_seconds)
        try:
            conn.request("GET", f"{url.path}?{url.query}" if url.query else url.path)
            resp = conn.getresponse()
            body = resp.read(2048).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException) as e:
            return ProbeResult(False, f"{type(e).__name__}: {e}")
        finally:
            conn.close()
        if resp.status == 200 and (check.expect is None or check.expect in body):
            return ProbeResult(True, body or "ok")
        if resp.status == 200:
            return ProbeResult(False, f"not {check.expect!r} yet: {body[-200:]}")
        return ProbeResult(False, f"HTTP {resp.status}: {body[-500:]}")

"""Health probes against a local HTTP server answering like kube-controller-manager does: its
plain /healthz says ok while its controllers are still being built; only the verbose answer
tells them running."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpumon.devcluster.components import HealthCheck
from gpumon.devcluster.health import Prober

BUILDING = "[+]ping ok\nhealthz check passed\n"
RUNNING = "[+]ping ok\n[+]replicaset-controller ok\nhealthz check passed\n"


class Manager(BaseHTTPRequestHandler):
    body = BUILDING

    def do_GET(self) -> None:
        if self.path != "/healthz?verbose":
            self.send_error(404, f"no {self.path}")
            return
        data = self.body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def manager() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Manager)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_probe_sends_the_query_and_wants_the_expected_text(manager: str) -> None:
    prober = Prober(Path("ca"), Path("cert"), Path("key"))
    check = HealthCheck(f"{manager}/healthz?verbose", client_cert=False, expect="-controller ok")
    Manager.body = BUILDING
    building = prober.probe(check)
    assert not building.ok and "not '-controller ok' yet" in building.detail
    Manager.body = RUNNING
    assert prober.probe(check).ok
    assert prober.probe(HealthCheck(f"{manager}/healthz?verbose", client_cert=False)).ok
    assert not prober.probe(HealthCheck(f"{manager}/healthz", client_cert=False)).ok  # the query matters

"""The one corner of the Kubernetes API the exporter's pod watch reads, for the NVML tier, which
starts no control plane: ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` as a list
(PodList with a resourceVersion) and as a watch that stays open with no events. A kubeconfig
points ``gpumon exporter`` at it. The real API server is the cluster and e2e tiers' part
(tests/e2e/test_pod_attribution.py); this tier only needs pod names for container IDs, so that
NVML's processes can be attributed through /proc.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml


def pod(
    namespace: str, name: str, uid: str, node: str, containers: dict[str, str], limits: dict[str, str]
) -> dict[str, Any]:
    """A running pod whose containers (name -> runtime container ID) all have ``limits``."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid, "resourceVersion": "1"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": c, "resources": {"limits": limits}} for c in containers],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": f"containerd://{cid}", "ready": True}
                for c, cid in containers.items()
            ],
        },
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path != "/api/v1/pods":
            self.send_error(404)
            return
        node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
        if query.get("watch", ["false"])[0] in ("true", "1", "True"):
            # No changes to report: hold the watch open until the test ends.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.flush()
            self.server.stopping.wait()
            return
        items = [p for p in self.server.pods if p["spec"]["nodeName"] == node]
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                           "items": items}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, pods: Sequence[dict[str, Any]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pods = list(pods)
        self.stopping = threading.Event()


@contextlib.contextmanager
def serve(pods: Sequence[dict[str, Any]], kubeconfig: Path) -> Iterator[Path]:
    """Serve ``pods`` until the block exits; yields a kubeconfig naming the server."""
    server = _Server(pods)
    thread = threading.Thread(target=server.serve_forever, name="pods-api", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "nvml", "cluster": {"server": url}}],
                "users": [{"name": "nvml", "user": {}}],
                "contexts": [{"name": "nvml", "context": {"cluster": "nvml", "user": "nvml"}}],
                "current-context": "nvml",
            }
        )
    )
    try:
        yield kubeconfig
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()

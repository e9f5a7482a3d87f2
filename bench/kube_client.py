"""``python -m bench.kube_client``: what gpumon's API client costs beside the generated one.

- **Memory**: a fresh interpreter imports aiohttp, then either gpumon.kube (the client, its
  credential reader, the informer) or kubernetes_asyncio's client and config loader (what
  the controller imported until gpumon.kube replaced it), and prints VmRSS.
- **CPU per request**: a local aiohttp server (another process) answers GET with a 2 KiB JSON
  object; each client asks it ``--requests`` times, one request after the other, and the
  client process's CPU time per request is printed. The generated client is driven as the
  controller drove it: ``ApiClient.call_api`` with ``_preload_content=False``, the body read and
  decoded with ``json.loads``.

Prints its figures; the decision they support is in docs/decisions.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from bench.procs import free_port

_RSS = """
import importlib, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
for m in sys.argv[1:]:
    importlib.import_module(m)
print(round(rss(), 1))
"""

IMPORTS = {
    "aiohttp alone": ("aiohttp",),
    # Both programs load pydantic for their configuration anyway.
    "aiohttp + pydantic": ("aiohttp", "pydantic"),
    "aiohttp + gpumon.kube (client, informer)": ("aiohttp", "gpumon.kube.client", "gpumon.kube.informer"),
    "aiohttp + kubernetes_asyncio": ("aiohttp", "kubernetes_asyncio.client", "kubernetes_asyncio.config"),
}

_SERVER = """
import json, sys
from aiohttp import web
labels = {f"l{i}": "v" * 40 for i in range(40)}
body = json.dumps({"kind": "Node", "metadata": {"name": "n", "labels": labels}})
async def answer(request):
    return web.Response(text=body, content_type="application/json")
app = web.Application()
app.router.add_get("/api/v1/nodes/n", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def rss_mib(modules: tuple[str, ...]) -> float:
    out = subprocess.run([sys.executable, "-c", _RSS, *modules], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


async def _gpumon(server: str, requests: int) -> float:
    from gpumon.kube.client import KubeClient
    from gpumon.kube.credentials import Credentials

    async with KubeClient(Credentials(server, None)) as api:
        await api.get("/api/v1/nodes/n")
        started = time.process_time()
        for _ in range(requests):
            await api.get("/api/v1/nodes/n")
        return time.process_time() - started


async def _generated(server: str, requests: int) -> float:
    from kubernetes_asyncio import client

    configuration = client.Configuration(host=server)
    async with client.ApiClient(configuration) as api:

        async def get() -> Any:
            resp = await api.call_api(
                "/api/v1/nodes/n",
                "GET",
                query_params=[],
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=30.0,
            )
            raw = await resp.read()
            resp.release()
            return json.loads(raw)

        await get()
        started = time.process_time()
        for _ in range(requests):
            await get()
        return time.process_time() - started


async def _wait_listening(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError("the stand-in server did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kube_client")
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    for label, modules in IMPORTS.items():
        print(f"RSS, {label}: {rss_mib(modules)} MiB")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    try:
        asyncio.run(_wait_listening(port))
        url = f"http://127.0.0.1:{port}"
        for label, run in (("gpumon.kube", _gpumon), ("kubernetes_asyncio", _generated)):
            seconds = asyncio.run(run(url, args.requests))
            print(f"CPU per GET, {label}: {seconds / args.requests * 1e6:.0f} µs")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

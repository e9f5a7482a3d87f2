"""``python -m bench.hostile_exporter``: the controller's direct source against one hostile
exporter (issue #18), printing a Markdown table for bench/RESULTS.md.

Two phases, each in a fresh process so one's memory does not hide the other's:

- **flood**: one exporter sends a state line, then ``health`` lines with new GPU UUIDs as fast
  as it can write; a second sends valid but useless lines about one GPU (its temperature) as
  fast; a third, quiet exporter sends heartbeats. For ``--seconds`` the controller's
  event loop is probed every 50 ms (lag: how late the probe wakes), and the flooding node's GPU
  count is read once a second. Leader election shares that loop, so lag is what it would suffer.
- **body**: one exporter without a watch endpoint answers ``/api/v1/snapshot`` with a 200 MB body;
  the figure is the controller process's peak RSS before and after one poll.

The exporters run in a separate process (``serve``), so their own work is not on the loop
measured. Run it against another checkout with ``PYTHONPATH=<checkout>`` to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

from gpumon.controller.core.backoff import Backoff
from gpumon.controller.shell.signal_sources.direct import DirectSettings, DirectSource
from gpumon.controller.shell.signal_sources.endpoints import StaticEndpoints

BODY_BYTES = 200 << 20


def _gpu(uuid: str, index: int) -> dict[str, Any]:
    return {"gpu": index, "uuid": uuid, "health": {"state": "healthy", "reasons": []}}


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _state(node: str) -> bytes:
    doc = {"schema": 1, "type": "state", "node": node, "time": time.time(), "backend_up": True}
    return _line({**doc, "gpus": [_gpu("G0", 0)]})


async def _flood(request: web.Request) -> web.StreamResponse:
    """New GPU UUIDs (``/flood``), or valid-but-useless lines about one GPU (``/churn``)."""
    node = request.match_info["node"]
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(_state(node))
    n = 0
    try:
        while True:
            batch = []
            for _ in range(200):
                n += 1
                doc = {"schema": 1, "type": "health", "node": node, "time": time.time()}
                gpu = (
                    _gpu(f"GPU-{n}", n % 8)
                    if node == "flood"
                    else {**_gpu("G0", 0), "temperature_celsius": n % 90}
                )
                batch.append(_line({**doc, "previous": "healthy", "gpu": gpu}))
            await resp.write(b"".join(batch))
    except ConnectionError:
        return resp


async def _quiet(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(_state("quiet"))
    try:
        while True:
            await asyncio.sleep(0.5)
            await resp.write(_line({"schema": 1, "type": "heartbeat", "node": "quiet", "time": time.time()}))
    except ConnectionError:
        return resp


async def _big(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.content_type = "application/json"
    await resp.prepare(request)
    chunk = b" " * (1 << 20)
    try:
        await resp.write(b'{"gpus":[')
        for _ in range(BODY_BYTES >> 20):
            await resp.write(chunk)
        await resp.write(b"]}")
    except ConnectionError:
        pass
    return resp


async def serve(port: int) -> None:
    app = web.Application()
    app.router.add_get("/{node:flood|churn}/api/v1/watch", _flood)
    app.router.add_get("/quiet/api/v1/watch", _quiet)
    app.router.add_get("/big/api/v1/snapshot", _big)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def flood(base: str, seconds: float) -> dict[str, Any]:
    urls = {"flood": f"{base}/flood", "churn": f"{base}/churn", "quiet": f"{base}/quiet"}
    lags: list[float] = []
    most_gpus = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        src = DirectSource(
            DirectSettings(heartbeat_seconds=1.0),
            StaticEndpoints(urls),
            session,
            backoff=Backoff(initial_seconds=0.5, max_seconds=30.0),
        )
        task = asyncio.create_task(src.run(lambda nodes: None))
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        next_count = loop.time() + 1.0
        while loop.time() < end:
            due = loop.time() + 0.05
            await asyncio.sleep(0.05)
            lags.append(max(0.0, loop.time() - due))
            if loop.time() >= next_count:
                next_count += 1.0
                reading = src.current().nodes.get("flood")
                most_gpus = max(most_gpus, 0 if reading is None else len(reading.gpus))
        quiet_heard = "quiet" in src.current().nodes
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    lags.sort()
    return {
        "seconds": seconds,
        "most_gpus": most_gpus,
        "lag_max": lags[-1],
        "lag_p99": lags[int(len(lags) * 0.99) - 1],
        "errors": dict(src.errors),
        "quiet_heard": quiet_heard,
        "peak_rss_mb": _peak_rss_mb(),
    }


async def body(base: str) -> dict[str, Any]:
    before = _peak_rss_mb()
    async with aiohttp.ClientSession() as session:
        src = DirectSource(
            DirectSettings(poll_interval_seconds=3600.0, timeout_seconds=60.0),
            StaticEndpoints({"big": f"{base}/big"}),
            session,
        )
        task = asyncio.create_task(src.run(lambda nodes: None))
        while not src.errors:  # noqa: ASYNC110 - one fetch of a 200 MB body, then its verdict
            await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return {"rss_before_mb": before, "rss_peak_mb": _peak_rss_mb(), "errors": dict(src.errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("phase", choices=["all", "flood", "body", "serve"], nargs="?", default="all")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--port", type=int, default=18718)
    parser.add_argument("--base", default="")
    args = parser.parse_args()
    if args.phase == "serve":
        asyncio.run(serve(args.port))
        return
    if args.phase == "flood":
        print(json.dumps(asyncio.run(flood(args.base, args.seconds))))
        return
    if args.phase == "body":
        print(json.dumps(asyncio.run(body(args.base))))
        return
    me = [sys.executable, "-m", "bench.hostile_exporter"]
    server = subprocess.Popen([*me, "serve", "--port", str(args.port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        base = f"http://127.0.0.1:{args.port}"
        results = {}
        for phase in ("flood", "body"):
            out = subprocess.run(
                [*me, phase, "--base", base, "--seconds", str(args.seconds)],
                check=True,
                capture_output=True,
                text=True,
                env=os.environ,
            )
            results[phase] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait()
    f, b = results["flood"], results["body"]
    print("| figure | value |\n| --- | --- |")
    print(f"| flooding node: most GPU entries held, {f['seconds']:g} s | {f['most_gpus']:,} |")
    print(f"| event-loop lag under the flood, p99 / max | {f['lag_p99']:.3f} s / {f['lag_max']:.3f} s |")
    print(f"| quiet node still read | {'yes' if f['quiet_heard'] else 'no'} |")
    print(f"| refusals counted (flood phase) | {f['errors']} |")
    print(f"| peak RSS, flood phase | {f['peak_rss_mb']:.0f} MB |")
    rss = f"{b['rss_before_mb']:.0f} MB / {b['rss_peak_mb']:.0f} MB"
    print(f"| peak RSS before / after a 200 MB snapshot | {rss} |")
    print(f"| refusals counted (body phase) | {b['errors']} |")


if __name__ == "__main__":
    main()

"""The naive controller the benchmark compares gpumon's with: poll everything, every second.

``python -m bench.naive_controller --kubeconfig FILE --farm URL --nodes N`` runs rounds back to
back, one per ``--interval`` at most: list every Node and every Pod from the API server (paged,
as an informer's first list is), fetch every node's ``/api/v1/snapshot`` from the signal farm
(a bounded pool, as gpumon's snapshot poller has), then find the nodes with a GPU the exporter
does not call healthy and the pods on them. It writes nothing: its cost is what polling costs
before any action. One JSON line per round on stdout: start, seconds, CPU seconds, requests, bad nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from bench.scale_fleet import node_names
from gpumon.kube.client import KubeClient, connect

PAGE = 500  # the controller's informers list in pages of this size


async def list_all(api: KubeClient, path: str) -> tuple[list[Mapping[str, Any]], int]:
    items: list[Mapping[str, Any]] = []
    cont, requests = "", 0
    while True:
        params = {"limit": str(PAGE), **({"continue": cont} if cont else {})}
        doc = await api.get(path, params)
        requests += 1
        items += doc.get("items") or ()
        cont = str((doc.get("metadata") or {}).get("continue") or "")
        if not cont:
            return items, requests


async def snapshots(
    session: aiohttp.ClientSession, urls: Mapping[str, str], limit: asyncio.Semaphore
) -> dict[str, Mapping[str, Any]]:
    async def one(node: str, url: str) -> tuple[str, Mapping[str, Any] | None]:
        async with limit:
            try:
                async with session.get(f"{url}/api/v1/snapshot") as resp:
                    return node, (await resp.json()) if resp.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return node, None

    got = await asyncio.gather(*(one(n, u) for n, u in urls.items()))
    return {n: doc for n, doc in got if doc is not None}


def bad_nodes(docs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {
        node
        for node, doc in docs.items()
        if any((g.get("health") or {}).get("state", "healthy") != "healthy" for g in doc.get("gpus") or ())
    }


async def run(kubeconfig: Path, farm: str, count: int, interval: float, concurrency: int) -> None:
    api = connect(kubeconfig)
    urls = {n: f"{farm}/nodes/{n}" for n in node_names(count)}
    limit = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        try:
            while True:
                started, wall, cpu = time.monotonic(), time.time(), time.process_time()
                (nodes, node_requests), (pods, pod_requests), docs = await asyncio.gather(
                    list_all(api, "/api/v1/nodes"),
                    list_all(api, "/api/v1/pods"),
                    snapshots(session, urls, limit),
                )
                bad = bad_nodes(docs)
                on_bad = [p for p in pods if (p.get("spec") or {}).get("nodeName") in bad]
                seconds = time.monotonic() - started
                print(
                    json.dumps(
                        {
                            "start": wall,
                            "seconds": seconds,
                            "cpu_seconds": time.process_time() - cpu,
                            "api_requests": node_requests + pod_requests,
                            "nodes": len(nodes),
                            "pods": len(pods),
                            "snapshots": len(docs),
                            "bad_nodes": len(bad),
                            "pods_on_bad_nodes": len(on_bad),
                        }
                    ),
                    flush=True,
                )
                await asyncio.sleep(max(0.0, interval - seconds))
        finally:
            await api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive_controller", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--farm", required=True, help="the signal farm's base URL")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    asyncio.run(run(args.kubeconfig, args.farm, args.nodes, args.interval, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())

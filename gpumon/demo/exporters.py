"""One ``gpumon exporter`` process per node that exists (simulated GPUs, on a loopback port of
its own, chosen when the node joins), started when the node joins and stopped when it leaves;
the file Prometheus and the controller find them in; and the two calls the demo makes to them
(snapshot, fault)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gpumon.demo import fleet as fleet_mod
from gpumon.demo.agents import NodeAgents
from gpumon.demo.fleet import Fleet, NodeSpec
from gpumon.demo.scenario import Scenario
from gpumon.demo.views import ClusterView
from gpumon.devcluster.cluster import free_ports
from gpumon.devcluster.localservers import ExporterProcess
from gpumon.wire import v1 as wire

log = logging.getLogger(__name__)
_TIMEOUT = aiohttp.ClientTimeout(total=3)


class ExporterFleet:
    def __init__(
        self,
        fleet: Fleet,
        scenario: Scenario,
        root: Path,
        *,
        agents: NodeAgents,
        kubeconfig: Path,
        targets_file: Path,
    ) -> None:
        self._fleet = fleet
        self._scenario = scenario
        self._root = root
        self._agents = agents
        self._env = {"KUBECONFIG": str(kubeconfig)}  # the exporters' pod watch
        self._targets_file = targets_file
        self.running: dict[str, ExporterProcess] = {}
        self._joined = 0  # pool nodes seen so far: each one's simulated GPUs get a seed of their own
        self._write_targets()

    def start(self, spec: NodeSpec) -> ExporterProcess:
        workdir = self._root / spec.name
        (workdir / "proc").mkdir(parents=True, exist_ok=True)
        socket = self._agents.socket(spec.name, spec.template.gpu_count)
        config = fleet_mod.exporter_config(
            spec, self._scenario, pod_resources_socket=socket, host_proc=workdir / "proc"
        )
        (workdir / "exporter.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        process = ExporterProcess(
            workdir, "--config", str(workdir / "exporter.yaml"), port=spec.port, env=self._env
        )
        process.spawn()
        self.running[spec.name] = process
        self._write_targets()
        log.info("exporter started", extra={"node": spec.name, "url": process.url})
        return process

    async def sync(self, view: ClusterView) -> None:
        """Exporters for the nodes that joined, none for the nodes that left."""
        present = {n.name: n for n in view.nodes}
        for name in sorted(present.keys() - self.running.keys()):
            spec = self._fleet.static_spec(name)
            if spec is None and present[name].pool == fleet_mod.POOL:
                self._joined += 1
                (port,) = free_ports(1)
                spec = self._fleet.pool_spec(name, self._scenario, seed=self._joined, port=port)
            if spec is not None:
                self.start(spec)
        for name in sorted(self.running.keys() - present):
            process = self.running.pop(name)
            self._write_targets()
            await asyncio.to_thread(process.stop)
            log.info("exporter stopped", extra={"node": name})

    def _write_targets(self) -> None:
        ports = {name: p.port for name, p in self.running.items()}
        tmp = self._targets_file.with_suffix(".tmp")
        tmp.write_bytes(fleet_mod.targets_file_body(ports))
        tmp.replace(self._targets_file)  # neither reader ever sees half a file

    def stop_all(self) -> None:
        for process in self.running.values():
            process.stop(5.0)
        self.running.clear()

    async def snapshots(self, session: aiohttp.ClientSession) -> dict[str, wire.SnapshotDoc]:
        """The exporters' current snapshots; one that does not answer, or answers what the wire
        schema refuses, is left out; a refusal is logged, as the demo's exporters run this very
        gpumon and should never send one."""

        async def one(name: str, url: str) -> tuple[str, wire.SnapshotDoc | None]:
            try:
                async with session.get(f"{url}/api/v1/snapshot", timeout=_TIMEOUT) as resp:
                    return name, wire.parse_snapshot(await resp.read()) if resp.status == 200 else None
            except wire.WireError as e:
                log.warning(
                    "exporter snapshot refused by the wire schema", extra={"node": name, "error": str(e)}
                )
                return name, None
            except (aiohttp.ClientError, TimeoutError):
                return name, None

        got = await asyncio.gather(*(one(n, p.url) for n, p in list(self.running.items())))
        return {name: doc for name, doc in got if doc is not None}

    async def inject(self, session: aiohttp.ClientSession, node: str, body: Mapping[str, Any]) -> None:
        """POST a fault to the node's exporter; RuntimeError when it cannot be delivered."""
        process = self.running.get(node)
        if process is None:
            raise RuntimeError(f"node {node} has no exporter running")
        try:
            url = f"{process.url}/api/v1/faults"
            async with session.post(url, json=dict(body), timeout=_TIMEOUT) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"exporter of {node} refused {dict(body)}: {await resp.text()}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RuntimeError(f"exporter of {node} unreachable: {e!r}") from None

"""Bring a whole local control plane up and down: PKI and kubeconfigs, etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok on free loopback ports, then the CRDs.

Synchronous on purpose: pytest's session fixture and the CLI both call it from the main
thread, which must own the children (see :mod:`gpumon.devcluster.processes`)."""

from __future__ import annotations

import datetime
import logging
import socket
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from gpumon.devcluster import components, kubeconfig, pki, processes, resourceslices
from gpumon.devcluster.binaries import Tools, locate
from gpumon.devcluster.components import Component, Layout, Options, Ports
from gpumon.devcluster.health import Prober, ProbeResult

log = logging.getLogger(__name__)

ADMIN_KUBECONFIG = "admin"


class StartupError(Exception):
    """A component did not become healthy; the message carries the tail of its log."""


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: all sockets are held open until every port is chosen."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


@dataclass
class DevCluster:
    tools: Tools
    layout: Layout
    ports: Ports
    components: tuple[Component, ...]
    children: list[processes.Child] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self.layout.kubeconfig(ADMIN_KUBECONFIG)

    @property
    def prober(self) -> Prober:
        return Prober(self.layout.pki.ca_cert, self.layout.pki.admin_cert, self.layout.pki.admin_key)

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        options: Options | None = None,
        tools: Tools | None = None,
        timeout_seconds: float = 120.0,
    ) -> DevCluster:
        """Start every component and install the CRDs; on any failure, stop what started and
        raise :class:`StartupError`. ``root`` must be empty or absent."""
        t0 = time.monotonic()
        cluster = cls.prepare(root, options or Options(), tools or locate())
        cluster.timings["prepare"] = time.monotonic() - t0
        try:
            cluster._run(t0 + timeout_seconds)
        except BaseException:
            cluster.stop()
            raise
        cluster.timings["total"] = time.monotonic() - t0
        log.info(
            "devcluster ready",
            extra={"server": cluster.server, "seconds": round(cluster.timings["total"], 2)},
        )
        return cluster

    @classmethod
    def prepare(cls, root: Path, options: Options, tools: Tools) -> DevCluster:
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise StartupError(f"{root} is not empty: a cluster may still be using it")
        root = root.resolve()
        keys = pki.generate(datetime.datetime.now(datetime.UTC))
        layout = Layout(root, pki.write(keys, root / "pki"))
        ports = Ports(*free_ports(6))
        server = f"https://127.0.0.1:{ports.apiserver}"
        clients = {
            ADMIN_KUBECONFIG: (keys.admin, pki.ADMIN),
            "kube-controller-manager": (keys.controller_manager, pki.CONTROLLER_MANAGER),
            "kube-scheduler": (keys.scheduler, pki.SCHEDULER),
            "kwok": (keys.kwok, pki.KWOK),
        }
        for name, (pair, who) in clients.items():
            doc = kubeconfig.build(server, keys.ca.cert_pem, pair, who.user)
            kubeconfig.write(doc, layout.kubeconfig(name))
        layout.kwok_config.write_text(
            components.kwok_config([p.read_text() for p in tools.kwok_stages], options.kwok_pod_workers)
        )
        layout.device_classes.write_text(yaml.safe_dump_all(resourceslices.device_classes(), sort_keys=False))
        layout.audit_policy.write_text(components.audit_policy())
        return cls(tools, layout, ports, components.all_components(tools, ports, layout, options))

    def _spawn(self, c: Component) -> processes.Child:
        return processes.spawn(
            c.name, c.argv, self.layout.logs / f"{c.name}.log", cwd=self.layout.root, env=c.env or None
        )

    def _run(self, deadline: float) -> None:
        for wave in sorted({c.wave for c in self.components}):
            t = time.monotonic()
            started = []
            for c in (c for c in self.components if c.wave == wave):
                child = self._spawn(c)
                self.children.append(child)
                started.append((c, child))
            self._wait_healthy(started, deadline)
            self.timings[f"wave{wave}:" + ",".join(c.name for c, _ in started)] = time.monotonic() - t
        t = time.monotonic()
        # NVIDIA's DRA DeviceClasses go in with the CRDs: one kubectl, no extra start time.
        self.install_crds(
            self.tools.crds, max(1.0, deadline - time.monotonic()), also=(self.layout.device_classes,)
        )
        self.timings["crds"] = time.monotonic() - t

    def _wait_healthy(self, started: Sequence[tuple[Component, processes.Child]], deadline: float) -> None:
        prober = self.prober
        pending = list(started)
        last: dict[str, ProbeResult] = {}
        while pending:
            for c, child in list(pending):
                code = child.exited()
                if code is not None:
                    raise StartupError(
                        f"{c.name} exited with code {code} while starting; last lines of {child.log}:\n"
                        + processes.tail(child.log)
                    )
                last[c.name] = prober.probe(c.health)
                if last[c.name].ok:
                    pending.remove((c, child))
            if not pending:
                return
            if time.monotonic() > deadline:
                c, child = pending[0]
                raise StartupError(
                    f"{c.name} not healthy in time ({c.health.url}: {last[c.name].detail}); "
                    f"last lines of {child.log}:\n" + processes.tail(child.log)
                )
            time.sleep(0.1)

    def add_components(self, extra: Sequence[Component], timeout_seconds: float = 120.0) -> None:
        """Start more components on the running cluster, wave by wave, each waited healthy;
        they are stopped with the rest (Cluster API's manager and its infrastructure provider,
        which only the tests that scale real pools need). Call it from the thread that owns the
        cluster's children."""
        names = {c.name for c in self.components}
        clash = [c.name for c in extra if c.name in names]
        if clash:
            raise StartupError(f"already part of the cluster: {', '.join(clash)}")
        self.components = (*self.components, *extra)
        deadline = time.monotonic() + timeout_seconds
        for wave in sorted({c.wave for c in extra}):
            started = []
            for c in (c for c in extra if c.wave == wave):
                child = self._spawn(c)
                self.children.append(child)
                started.append((c, child))
            self._wait_healthy(started, deadline)

    def kubectl(self, *args: str, timeout_seconds: float = 60.0) -> str:
        cmd = [
            str(self.tools.kubectl),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.layout.root / 'kubectl-cache'}",
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_seconds, check=False)
        if done.returncode != 0:
            detail = done.stderr.strip() or done.stdout.strip()
            raise StartupError(f"kubectl {' '.join(args)} failed: {detail}")
        return done.stdout

    def install_crds(
        self, files: Sequence[Path], timeout_seconds: float, *, also: Sequence[Path] = ()
    ) -> None:
        """Server-side apply (with the objects in ``also``), then wait until every CRD is
        Established (served)."""
        if not files:
            return
        names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in files]
        files_args = [a for p in (*files, *also) for a in ("-f", str(p))]
        self.kubectl(
            "apply",
            "--server-side",
            "--field-manager=gpumon-devcluster",
            *files_args,
            timeout_seconds=timeout_seconds,
        )
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout_seconds)}s",
            *(f"crd/{n}" for n in names),
            timeout_seconds=timeout_seconds + 5,
        )

    # -- one component down and up again, in place -------------------------------------------

    def _member(self, name: str) -> tuple[int, Component]:
        """Where the component's child is in :attr:`children`, and the component."""
        component = next((c for c in self.components if c.name == name), None)
        if component is None:
            raise KeyError(f"no component {name!r} (have: {', '.join(c.name for c in self.components)})")
        for i, child in enumerate(self.children):
            if child.name == name:
                return i, component
        raise StartupError(f"{name} was never started: the cluster is not running")

    def stop_component(self, name: str, grace_seconds: float = 5.0) -> None:
        """Stop one component (SIGTERM, SIGKILL after the grace), keeping its files and its
        port, so :meth:`start_component` brings it back as it was. Blocks until it exited;
        any thread may call it."""
        i, _ = self._member(name)
        processes.stop([self.children[i]], grace_seconds)

    def start_component(self, name: str) -> None:
        """Start a stopped component again with its original command line: same port, same
        certificates, same data (the API server keeps talking to the same etcd). Returns once
        it is spawned: :meth:`wait_healthy`. Call it from the thread that owns the cluster's
        children (see :mod:`gpumon.devcluster.processes`), never from a short-lived one."""
        i, c = self._member(name)
        if self.children[i].exited() is None:
            raise StartupError(f"{name} is still running: stop it first")
        self.children[i] = self._spawn(c)

    def wait_healthy(self, *names: str, timeout_seconds: float = 120.0) -> None:
        """Block until each named component answers its health check (StartupError with the
        tail of its log otherwise). Any thread may call it."""
        members = [self._member(n) for n in names]
        self._wait_healthy([(c, self.children[i]) for i, c in members], time.monotonic() + timeout_seconds)

    def health(self) -> dict[str, ProbeResult]:
        prober = self.prober
        return {c.name: prober.probe(c.health) for c in self.components}

    def stop(self, grace_seconds: float = 5.0) -> None:
        # Clients first, etcd last: the API server drains its watches against a live store.
        processes.stop([c for c in self.children if c.name != "etcd"], grace_seconds)
        processes.stop([c for c in self.children if c.name == "etcd"], grace_seconds)
        self.children.clear()

    def __enter__(self) -> DevCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

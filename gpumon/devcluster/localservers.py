"""Real HTTP servers as supervised child processes on loopback: Debian's ``prometheus`` and
``gpumon exporter``. Used by the Prometheus test tier and by ``gpumon demo``.

Each runs through :func:`gpumon.devcluster.processes.spawn` (own process group, dies with its
parent), logs to one file whose tail goes into every error, and is stopped gently then killed.
Synchronous, like the rest of the harness: start them from the thread that owns the children.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpumon.devcluster import processes

READY_DEADLINE_SECONDS = 120.0  # other work shares the 2 cores: be patient
STOP_GRACE_SECONDS = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(
    url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_json(url: str, body: Any, *, timeout: float = 10.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class LoggedProcess:
    """A child process whose stdout and stderr go to one log file."""

    name = "process"

    def __init__(self, log_path: Path, *, env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        self.env = dict(env or {})
        self.child: processes.Child | None = None

    def _spawn(self, argv: Sequence[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.child = processes.spawn(self.name, argv, self.log_path, cwd=self.log_path.parent, env=self.env)

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.exited() is None

    def log_tail(self, lines: int = 60) -> str:
        return processes.tail(self.log_path, lines)

    def _wait_until(self, ready: Callable[[], bool], what: str, deadline_seconds: float) -> None:
        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline:
            assert self.child is not None, "not started"
            code = self.child.exited()
            if code is not None:
                raise RuntimeError(f"{self.name} exited with {code} before {what}:\n{self.log_tail()}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: not {what} after {deadline_seconds:.0f} s:\n{self.log_tail()}")

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        if self.child is not None:
            processes.stop([self.child], grace_seconds)


class PrometheusProcess(LoggedProcess):
    """The Debian ``prometheus`` binary on a loopback port, with its config and storage in
    ``workdir``. :meth:`configure` rewrites the config and reloads it; :meth:`query` and
    :meth:`wait_for` use the HTTP API."""

    name = "prometheus"

    def __init__(self, workdir: Path, *, scrape_interval: str = "1s", port: int | None = None) -> None:
        super().__init__(workdir / "prometheus.log")
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.scrape_interval = scrape_interval
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    @staticmethod
    def binary() -> str | None:
        return shutil.which("prometheus")

    def start(
        self, config: Mapping[str, Any] | None = None, *, deadline_seconds: float = READY_DEADLINE_SECONDS
    ) -> None:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed: run `make system-packages`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_config(config if config is not None else self.config())
        self._spawn(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=info",
            ]
        )
        self._wait_until(lambda: http_get(f"{self.url}/-/ready")[0] == 200, "ready", deadline_seconds)

    def config(
        self,
        jobs: Mapping[str, Sequence[str]] | None = None,
        *,
        rule_files: Sequence[Path] = (),
        alertmanagers: Sequence[str] = (),
        evaluation_interval: str = "1s",
    ) -> dict[str, Any]:
        """A Prometheus config scraping ``jobs`` (job name -> ["host:port", ...])."""
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in (jobs or {}).items()
            ],
        }
        if rule_files:
            config["rule_files"] = [str(p) for p in rule_files]
        if alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
        return config

    def configure(self, config: Mapping[str, Any]) -> None:
        """Replace the running config (see :meth:`config`) and wait until Prometheus applied it."""
        self._write_config(config)
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, response.read()
        wanted = {j["job_name"] for j in config.get("scrape_configs", [])}
        self._wait_until(
            lambda: self._active_jobs() >= wanted, "scraping the configured jobs", READY_DEADLINE_SECONDS
        )

    def _write_config(self, config: Mapping[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def _active_jobs(self) -> set[str]:
        targets = self.api("targets")["activeTargets"]
        return {t["labels"]["job"] for t in targets}

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else an AssertionError."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def wait_for(
        self,
        expr: str,
        *,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``until(result)`` holds; the last result on timeout is in the error."""
        deadline = time.monotonic() + timeout
        result = self.query(expr)
        while not until(result):
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} not satisfied after {timeout:.0f} s; last: {result}")
            time.sleep(0.5)
            result = self.query(expr)
        return result


class ExporterProcess(LoggedProcess):
    """``gpumon exporter`` on a loopback port (a free one unless given), ``args`` appended.
    :meth:`spawn` and :meth:`wait_ready` apart let several start side by side."""

    name = "gpumon exporter"

    def __init__(
        self, workdir: Path, *args: str, port: int | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(workdir / "exporter.log", env=env)
        self.port = port or free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.target}"
        self.args = args

    def spawn(self) -> None:
        self._spawn(
            [
                sys.executable,
                "-m",
                "gpumon.cli",
                "exporter",
                "--listen-address",
                "127.0.0.1",
                "--port",
                str(self.port),
                *self.args,
            ]
        )

    def wait_ready(self, deadline_seconds: float = READY_DEADLINE_SECONDS) -> None:
        self._wait_until(lambda: http_get(f"{self.url}/readyz")[0] == 200, "ready", deadline_seconds)

    def start(self, *, deadline_seconds: float = READY_DEADLINE_SECONDS) -> None:
        self.spawn()
        self.wait_ready(deadline_seconds)

    def metrics(self, accept: str = "text/plain") -> bytes:
        status, body = http_get(f"{self.url}/metrics", headers={"Accept": accept})
        assert status == 200, body
        return body

    def inject(self, fault: Mapping[str, Any]) -> Any:
        """POST one fault (docs/exporter.md, "Fault injection"); the answer, or RuntimeError."""
        status, answer = http_post_json(f"{self.url}/api/v1/faults", dict(fault))
        if status != 200:
            raise RuntimeError(f"{self.name} refused fault {dict(fault)}: {status} {answer!r}")
        return answer


class ControllerProcess(LoggedProcess):
    """``gpumon controller --config FILE`` on a loopback port (the file's ``listen_address``
    and ``port`` are set to it), ``args`` appended (``--act``). :meth:`leading`: caches synced
    and the lease held."""

    name = "gpumon controller"

    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, Any],
        *args: str,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir / "controller.log", env=env)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = workdir / "controller.yaml"
        self.config = {**config, "listen_address": "127.0.0.1", "port": self.port}
        self.args = args

    def spawn(self) -> None:
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self._spawn(
            [sys.executable, "-m", "gpumon.cli", "controller", "--config", str(self.config_file), *self.args]
        )

    def leading(self) -> bool:
        try:
            if http_get(f"{self.url}/readyz", timeout=2)[0] != 200:
                return False
            status, body = http_get(f"{self.url}/metrics", timeout=2)
        except OSError:  # not listening yet
            return False
        return status == 200 and b"gpumon_controller_leader 1.0" in body

    def start(self, *, deadline_seconds: float = READY_DEADLINE_SECONDS) -> None:
        self.spawn()
        self._wait_until(self.leading, "leading", deadline_seconds)

    def metrics(self) -> bytes:
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200, body
        return body

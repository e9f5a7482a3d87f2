"""The alerting rules, checked by the real promtool and Prometheus.

- ``promtool check rules`` accepts the file, and ``promtool test rules`` passes every unit test
  in alerts/tests/, which between them make every alert both fire and stay quiet;
- every alert carries a severity, a summary, a description and a runbook section that exists;
- end to end: a real Prometheus evaluates the rules against a simulated exporter whose GPU is
  broken at run time, and a real Alertmanager delivers the alert to a webhook in this test.
"""

from __future__ import annotations

import http.server
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    FLEET_JOB,
    READY_DEADLINE_SECONDS,
    ExporterProcess,
    PrometheusProcess,
    _LoggedProcess,
    free_port,
    http_get,
    http_post_json,
)

from gpumon.gpu.health import ACTION_XIDS
from gpumon.gpu.model import HealthState

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "gpumon.rules.yml"
UNIT_TESTS = sorted((REPO / "alerts" / "tests").glob("*.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    # `make setup` installs promtool (hack/system-packages.sh): missing, this tier fails.
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool not on PATH: run `make setup`"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS
    result = _promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A rule that no longer matches its test makes promtool fail: the tests bite."""
    broken = RULES.read_text().replace('expr: gpumon_gpu_health{state="lost"} == 1', "expr: vector(0) == 1")
    assert broken != RULES.read_text()
    (tmp_path / "gpumon.rules.yml").write_text(broken)
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(REPO / "alerts" / "tests" / "gpu_health_test.yml", tests)
    result = _promtool("test", "rules", str(tests / "gpu_health_test.yml"))
    assert result.returncode != 0 and "GpuLost" in result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def _runbook_anchors() -> set[str]:
    headings = re.findall(r"^#+\s+(.+?)\s*$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    anchors = _runbook_anchors()
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        assert url == f"docs/runbooks.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name}"


def test_fatal_xid_alert_matches_the_exporters_unhealthy_xids() -> None:
    """The rule's Xid list and gpu/health.py's catalog are two copies of one decision."""
    expr = next(a["expr"] for a in _alerts() if a["alert"] == "GpuFatalXid")
    lists = set(re.findall(r'xid=~"([0-9|]+)"', expr))
    assert len(lists) == 1
    in_rule = {int(x) for x in lists.pop().split("|")}
    unhealthy = {xid for xid, k in ACTION_XIDS.items() if k.state.rank >= HealthState.UNHEALTHY.rank}
    assert in_rule == unhealthy


# ---------------------------------------------------------------------------------------------
# End to end: exporter -> Prometheus (rules) -> Alertmanager -> webhook


class _Webhook:
    """An HTTP receiver for Alertmanager's webhook notifications, in a thread of this test."""

    def __init__(self) -> None:
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        received = self.received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.put(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for_alert(self, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The first alert of any notification that ``match`` accepts; every alert seen is kept."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((a for a in self.seen if match(a)), None)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching alert within {timeout:.0f} s; received: {self.seen}")
            try:
                self.seen.extend(self.received.get(timeout=remaining)["alerts"])
            except queue.Empty:
                continue

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class AlertmanagerProcess(_LoggedProcess):
    name = "alertmanager"

    def __init__(self, workdir: Path, webhook_url: str) -> None:
        super().__init__(workdir / "alertmanager.log")
        self.workdir = workdir
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.config = {
            "route": {
                "receiver": "test-webhook",
                "group_by": ["alertname", "node", "gpu"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "test-webhook", "webhook_configs": [{"url": webhook_url}]}],
        }

    def start(self) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            raise RuntimeError("Alertmanager is not installed: run `make system-packages`")
        config_path = self.workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(self.config))
        self._spawn(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address={self.target}",
                "--cluster.listen-address=",  # a single instance: no gossip port
            ]
        )
        self._wait_until(
            lambda: http_get(f"http://{self.target}/-/ready")[0] == 200, "ready", READY_DEADLINE_SECONDS
        )


@pytest.fixture
def webhook() -> Iterator[_Webhook]:
    receiver = _Webhook()
    yield receiver
    receiver.close()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook: _Webhook) -> Iterator[AlertmanagerProcess]:
    process = AlertmanagerProcess(tmp_path, webhook.url)
    try:
        process.start()
        yield process
    finally:
        process.stop()


@pytest.fixture
def broken_node_exporter(tmp_path: Path) -> Iterator[ExporterProcess]:
    process = ExporterProcess(
        tmp_path,
        "--backend",
        "simulated",
        "--node-name",
        "alert-node",
        "--simulate-gpus",
        "2",
        "--slow-interval",
        "1",
    )
    try:
        process.start()
        yield process
    finally:
        process.stop()


def _rules_evaluated_after(prometheus: PrometheusProcess, moment: float) -> bool:
    groups = prometheus.api("rules")["groups"]
    return bool(groups) and all(
        datetime.fromisoformat(g["lastEvaluation"].replace("Z", "+00:00")).timestamp() > moment
        for g in groups
    )


def test_broken_gpu_alert_reaches_alertmanager_webhook(
    prometheus: PrometheusProcess,
    broken_node_exporter: ExporterProcess,
    alertmanager: AlertmanagerProcess,
    webhook: _Webhook,
) -> None:
    prometheus.configure(
        prometheus.config(
            {FLEET_JOB: [broken_node_exporter.target]},
            rule_files=[RULES],
            alertmanagers=[alertmanager.target],
        )
    )
    prometheus.wait_for(
        'gpumon_gpu_health{node="alert-node", state="healthy"} == 1', until=lambda r: len(r) == 2
    )
    # Healthy GPUs, every rule evaluated on their data: nothing fires.
    seen_healthy = time.time()
    deadline = time.monotonic() + 60
    while not _rules_evaluated_after(prometheus, seen_healthy):
        assert time.monotonic() < deadline, "rules never evaluated"
        time.sleep(0.5)
    assert prometheus.query('ALERTS{node="alert-node"}') == []

    status, answer = http_post_json(
        f"{broken_node_exporter.url}/api/v1/faults", {"gpu": 1, "fault": "ecc", "count": 3}
    )
    assert status == 200, answer

    alert = webhook.wait_for_alert(
        lambda a: (
            a["labels"].get("alertname") == "GpuEccUncorrectable" and a["labels"].get("node") == "alert-node"
        ),
        timeout=120,
    )
    assert alert["status"] == "firing"
    assert alert["labels"]["gpu"] == "1" and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == FLEET_JOB
    assert alert["annotations"]["summary"] == "Uncorrectable ECC errors on GPU 1 of node alert-node"
    assert "has 3 uncorrectable" in alert["annotations"]["description"]
    assert alert["annotations"]["runbook_url"] == "docs/runbooks.md#gpueccuncorrectable"
    # The same fault's Xid 48 arrives through the other path (event -> counter -> rule).
    webhook.wait_for_alert(
        lambda a: a["labels"].get("alertname") == "GpuFatalXid" and a["labels"].get("xid") == "48",
        timeout=60,
    )
    assert all(a["labels"].get("gpu") == "1" for a in webhook.seen if a["labels"].get("node") == "alert-node")

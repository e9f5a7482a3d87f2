"""``gpumon status`` as a command: its arguments, its rounds (``--watch``), what it prints, and
its exit codes when the cluster cannot be read."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from status_builders import event, node, pod, record, state

from gpumon.cli import main
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.status import render
from gpumon.status.command import Failed, node_argument, rounds
from gpumon.status.explain import build_explanation
from gpumon.status.fleet import build_fleet
from gpumon.status.model import Explanation, FleetStatus


def fleet_view() -> FleetStatus:
    nodes = [node("gpu-a-1", records=(record(1),), quarantined_ago=90, state="drained"), node("gpu-a-2")]
    events = (
        event("Pod", "train-0", "GpuPodEvicted", "evicted from node gpu-a-1: uses GPU 1", namespace="ml"),
    )
    return build_fleet(
        state(nodes, [pod("ml", "waiting", phase="Pending")], events=events), pool_label="gpumon.io/pool"
    )


def explanation() -> Explanation:
    st = state([node("gpu-a-1", records=(record(1),), quarantined_ago=90)])
    return build_explanation(st, pool_label="gpumon.io/pool", policy=build_policy(ControllerConfig()))


def drawn(view: FleetStatus | Explanation) -> str:
    console = Console(record=True, width=200)
    console.print(render.fleet(view) if isinstance(view, FleetStatus) else render.explanation(view))
    return console.export_text()


@pytest.mark.parametrize(
    ("target", "expected"), [([], None), (["node", "gpu-a-1"], "gpu-a-1"), (["allocation"], "allocation")]
)
def test_fleet_or_one_node(target: list[str], expected: str | None) -> None:
    assert node_argument(target) == expected


@pytest.mark.parametrize("target", [["node"], ["nodes", "x"], ["node", "a", "b"], ["allocation", "x"]])
def test_anything_else_is_a_usage_error(target: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Failed):
        node_argument(target)
    assert main(["status", *target]) == 2
    assert "expected nothing, `node NAME` or `allocation`" in capsys.readouterr().err


def test_node_goes_with_allocation_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--node", "gpu-a-1"]) == 2
    assert "--node goes with `allocation`" in capsys.readouterr().err


async def test_watch_shows_every_round_and_keeps_going_after_a_failed_one() -> None:
    views = [Failed("cannot reach the API server: refused"), fleet_view(), fleet_view()]
    shown: list[object] = []
    slept: list[float] = []

    async def build() -> FleetStatus:
        view = views.pop(0)
        if isinstance(view, Failed):
            raise view
        return view

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if not views:
            raise KeyboardInterrupt  # what Ctrl-C does

    with pytest.raises(KeyboardInterrupt):
        await rounds(build, shown.append, watch=True, interval_seconds=2.5, sleep=sleep)
    assert [type(v).__name__ for v in shown] == ["Failed", "FleetStatus", "FleetStatus"] and slept == [
        2.5
    ] * 3


async def test_a_watch_ends_when_stopped_even_if_a_round_ate_the_interrupt() -> None:
    """Ctrl-C sets the stop event; the watch ends after the round in flight, whatever that
    round did with the cancellation asyncio.run would otherwise send."""
    stop = asyncio.Event()
    shown: list[object] = []

    async def build() -> FleetStatus:
        if len(shown) == 1:
            stop.set()  # the signal arrives during the second round
        return fleet_view()

    async def sleep(seconds: float) -> None:
        pass

    code = await rounds(build, shown.append, watch=True, interval_seconds=1, sleep=sleep, stopped=stop.is_set)
    assert code == 130 and len(shown) == 2


async def test_one_round_exit_codes() -> None:
    async def fails() -> FleetStatus:
        raise Failed("no node named 'x'")

    async def works() -> FleetStatus:
        return fleet_view()

    async def never(seconds: float) -> None:
        raise AssertionError("no sleeping without --watch")

    assert await rounds(fails, lambda v: None, watch=False, interval_seconds=1, sleep=never) == 1
    assert await rounds(works, lambda v: None, watch=False, interval_seconds=1, sleep=never) == 0


def test_the_fleet_table() -> None:
    text = drawn(fleet_view())
    expected = (
        "Pools", "a100", "15 healthy, 1 unhealthy", "Quarantined nodes", "gpu-a-1", "drained", "1m30s",
        "GPU 1: XidFatal [xid-unhealthy] Xid 79", "ml/train-0", "Pending GPU pods: 1 asking for 1 GPU(s)",
        "acting (from events)",
    )  # fmt: skip
    for words in expected:
        assert words in text, words


def test_the_node_explanation() -> None:
    text = drawn(explanation())
    expected = (
        "node gpu-a-1", "quarantined 1m30s ago", "Rules that fired", "xid-unhealthy",
        "Latest signals: not available", "What would lift the quarantine", "stay clear for 15m00s",
    )  # fmt: skip
    for words in expected:
        assert words in text, words


def test_json_and_yaml_documents() -> None:
    view = fleet_view()
    doc = json.loads(render.dumps(view, "json"))
    assert doc["quarantined"][0]["problems"][0]["rules"] == ["xid-unhealthy"]
    line = render.dumps(view, "json", stream=True)
    assert line.count("\n") == 1 and json.loads(line) == doc
    assert yaml.safe_load(render.dumps(view, "yaml")) == doc
    assert render.dumps(view, "yaml", stream=True).startswith("---\n")


def test_no_credentials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert "gpumon status: no Kubernetes credentials" in capsys.readouterr().err


def test_an_api_server_that_does_not_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{s.getsockname()[1]}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        assert main(["status", "--kubeconfig", str(kubeconfig), "--output", "json"]) == 1
    assert "gpumon status: cannot reach the API server" in capsys.readouterr().err


def test_an_interval_out_of_range_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--watch", "--interval", "0"]) == 2
    assert "--interval: must be >= 0.1" in capsys.readouterr().err


def test_a_bad_controller_config_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text("breaker: {max_fraction: 3}\n")
    assert main(["status", "--config", str(config)]) == 2
    assert "breaker.max_fraction" in capsys.readouterr().err

"""``gpumon doctor`` through the CLI: the exporter's flags, JSON output and exit codes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from fake_host_proc import cgroup_file, write_process

from gpumon.cli import main
from gpumon.doctor.command import ORDER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A machine without NVIDIA anything: flags and environment as an exporter pod would have."""
    proc = tmp_path / "proc"
    write_process(proc, 1, cgroup_file("/init.scope", 2))
    (tmp_path / "dev").mkdir()
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    monkeypatch.setenv("GPUMON_PODS__POD_RESOURCES_SOCKET", str(tmp_path / "kubelet.sock"))
    monkeypatch.setenv("GPUMON_PODS__API", "false")
    return ["--host-proc", str(proc), "--port", str(free_port()), "--dev-root", str(tmp_path / "dev")]


def test_json_output_and_exit_code_2_on_a_machine_without_a_driver(
    node: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["doctor", "--output", "json", "--timeout", "20", *node])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 == doc["exit_code"]
    families = [c["family"] for c in doc["checks"]]
    assert families == sorted(families, key=ORDER.index) and set(families) == set(ORDER)
    status = {(c["family"], c["name"]): c["status"] for c in doc["checks"]}
    assert status[("nvml", "NVML")] == "fail"
    assert status[("devices", "device files")] == "fail"
    assert status[("kube-api", "node name")] == "ok"
    assert status[("kube-api", "list pods on this node")] == "ok"  # pods.api=false from the environment
    assert status[("pod-resources", "pod-resources socket")] == "fail"
    assert status[("exporter", "exporter endpoint")] == "fail"
    assert doc["summary"]["fail"] == sum(1 for c in doc["checks"] if c["status"] == "fail")
    assert all(c["fix"] for c in doc["checks"] if c["status"] != "ok")


def test_the_table_for_people(node: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", *node]) == 2
    out = capsys.readouterr().out
    assert "gpumon doctor" in out and "NVML unavailable" in " ".join(out.split())
    assert "(exit code 2)" in out


def test_simulated_gpus_skip_the_driver_checks(node: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    main(["doctor", "--output", "json", "--backend", "simulated", *node])
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert "devices" not in {c["family"] for c in checks}
    (nvml,) = [c for c in checks if c["family"] == "nvml"]
    assert nvml["status"] == "ok"


@pytest.mark.parametrize("timeout", ["0", "-1", "601", "nan"])
def test_a_timeout_out_of_range_names_the_flag(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--timeout", timeout]) == 2
    assert "--timeout: must be > 0 and <= 600" in capsys.readouterr().err


def test_a_timeout_that_is_not_a_number_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--timeout", "soon"])
    assert e.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_bad_exporter_configuration_names_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--port", "70000"]) == 2
    assert "port: Input should be less than or equal to 65535" in capsys.readouterr().err

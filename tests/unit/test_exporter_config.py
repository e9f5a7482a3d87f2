"""`gpumon exporter` configuration: bad input -> exit 2 with one readable message; precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.cli import build_parser, main
from gpumon.config import ExporterConfig
from gpumon.exporter.command import load_config

# Nothing in these tests may reach the point of serving: keep them from binding a real port.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("GPUMON_"):
            monkeypatch.delenv(name)


BAD_FLAGS = [
    (["--port", "70000"], "port: Input should be less than or equal to 65535"),
    (["--port", "http"], "port: Input should be a valid integer"),
    (["--fast-interval", "-1"], "sampling.fast_interval_seconds: Input should be greater than 0"),
    (
        ["--fast-interval", "5", "--slow-interval", "2"],
        "slow_interval_seconds must be >= fast_interval_seconds",
    ),
    (["--call-timeout", "0"], "sampling.call_timeout_seconds"),
    (["--metrics-profile", "prom"], "metrics_profile: Input should be 'native', 'dcgm' or 'both'"),
    (["--backend", "cuda"], "backend: Input should be 'nvml' or 'simulated'"),
    (["--simulate-gpus", "0"], "simulation.gpus: Input should be greater than or equal to 1"),
    (["--backend", "simulated", "--simulate-model", "V100"], "simulation.model: unknown GPU model 'V100'"),
    (["--log-level", "loud"], "log.level: Input should be"),
    (["--log-format", "xml"], "log.format: Input should be 'text' or 'json'"),
    (["--listen-address", "a b"], "listen_address: must be a host name or IP address"),
    (["--node-name", ""], "node_name: String should have at least 1 character"),
    (["--tls-cert-file", "/tmp/cert.pem"], "tls: cert_file and key_file go together"),
]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(["exporter", *argv])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(("argv", "message"), BAD_FLAGS)
def test_bad_flags_exit_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, err = _run(capsys, argv)
    assert code == 2
    assert err.startswith("gpumon exporter: invalid configuration:")
    assert message in err
    assert "Traceback" not in err


def test_bad_files_exit_2_naming_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("sampling: [\n")
    unknown_key = tmp_path / "unknown.yaml"
    unknown_key.write_text("sampling:\n  fast: 1\n")
    bad_scenario = tmp_path / "scenario.yaml"
    bad_scenario.write_text("faults: [{at: 1, gpu: 0, fault: melt}]\n")
    far_scenario = tmp_path / "far.yaml"
    far_scenario.write_text("faults: [{at: 1, gpu: 12, fault: lost}]\n")
    cases = [
        (["--config", missing], f"cannot read config file {missing}"),
        (["--config", str(bad_yaml)], "is not valid YAML at line 2"),
        (["--config", str(unknown_key)], "sampling.fast: Extra inputs are not permitted"),
        (["--backend", "simulated", "--scenario", missing], "simulation.scenario: cannot read"),
        (
            ["--backend", "simulated", "--scenario", str(bad_scenario)],
            "does not match any of the expected tags",
        ),
        (
            ["--backend", "simulated", "--scenario", str(far_scenario)],
            "simulation.scenario: gpu 12 does not exist",
        ),
        (["--bearer-token-file", missing], "auth.bearer_token_file: cannot read"),
        (
            ["--backend", "simulated", "--tls-cert-file", missing, "--tls-key-file", missing],
            "tls.cert_file: cannot read certificate",
        ),
    ]
    for argv, message in cases:
        code, err = _run(capsys, argv)
        assert (code, "Traceback" in err) == (2, False), (argv, err)
        assert message in err, (argv, err)


def test_bad_environment_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUMON_PORT", "many")
    monkeypatch.setenv("GPUMON_SAMPLING__FAST_INTERVAL_SECONDS", "0")
    code, err = _run(capsys, [])
    assert code == 2 and "Traceback" not in err
    assert "  port: Input should be a valid integer" in err
    assert "  sampling.fast_interval_seconds: Input should be greater than 0" in err


def _config(argv: list[str]) -> ExporterConfig:
    return load_config(build_parser().parse_args(["exporter", *argv]))


def test_flags_beat_environment_beat_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "exporter.yaml"
    file.write_text(
        "port: 1111\nbackend: simulated\nsampling:\n  fast_interval_seconds: 3\n  slow_interval_seconds: 30\n"
    )
    assert _config(["--config", str(file)]).port == 1111
    monkeypatch.setenv("GPUMON_PORT", "2222")
    assert _config(["--config", str(file)]).port == 2222
    cfg = _config(["--config", str(file), "--port", "3333", "--slow-interval", "40"])
    assert cfg.port == 3333
    # Nested sections merge key by key across sources.
    assert (cfg.sampling.fast_interval_seconds, cfg.sampling.slow_interval_seconds) == (3, 40)
    assert cfg.backend == "simulated", "a flag not given does not override the file"


def test_flags_not_given_leave_the_defaults() -> None:
    cfg = _config([])
    assert cfg.port == 9842 and cfg.backend == "nvml" and cfg.metrics_profile == "native"
    assert cfg.sampling.fast_interval_seconds == 1 and cfg.sampling.slow_interval_seconds == 10


def test_every_flag_maps_onto_a_config_key(tmp_path: Path) -> None:
    cfg = _config(
        [
            "--node-name", "gpu-node-7",
            "--listen-address", "127.0.0.1",
            "--port", "9000",
            "--metrics-profile", "both",
            "--backend", "simulated",
            "--nvml-library", "/opt/nvidia/libnvidia-ml.so.1",
            "--simulate-gpus", "2",
            "--simulate-model", "T4",
            "--simulate-seed", "9",
            "--scenario", str(tmp_path / "s.yaml"),
            "--fast-interval", "0.5",
            "--slow-interval", "5",
            "--call-timeout", "1.5",
            "--tls-cert-file", "/c.pem",
            "--tls-key-file", "/k.pem",
            "--bearer-token-file", "/t",
            "--log-format", "json",
            "--log-level", "debug",
        ]
    )  # fmt: skip
    assert (cfg.node_name, cfg.listen_address, cfg.port, cfg.metrics_profile) == (
        "gpu-node-7",
        "127.0.0.1",
        9000,
        "both",
    )
    assert (cfg.backend, cfg.nvml_library) == ("simulated", Path("/opt/nvidia/libnvidia-ml.so.1"))
    sim = cfg.simulation
    assert (sim.gpus, sim.model, sim.seed, sim.scenario) == (2, "T4", 9, tmp_path / "s.yaml")
    s = cfg.sampling
    assert (s.fast_interval_seconds, s.slow_interval_seconds, s.call_timeout_seconds) == (0.5, 5, 1.5)
    assert (cfg.tls.cert_file, cfg.tls.key_file, cfg.auth.bearer_token_file) == (
        Path("/c.pem"),
        Path("/k.pem"),
        Path("/t"),
    )
    assert (cfg.log.format, cfg.log.level) == ("json", "debug")

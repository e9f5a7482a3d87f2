"""The ``GPUMON_…`` layer of configuration (gpumon.config.load), read without pydantic-settings:
the same names and precedence it had (flags > environment > file), each bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.config import ConfigError, ExporterConfig, load
from gpumon.config.controller import ControllerConfig
from gpumon.gpu.model import HealthState


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("GPUMON_"):
            monkeypatch.delenv(name)


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_a_section_as_json_and_one_key_of_it_merged_over_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        GPUMON_SAMPLING='{"fast_interval_seconds": 2, "slow_interval_seconds": 20}',
        GPUMON_SAMPLING__SLOW_INTERVAL_SECONDS="30",
    )
    sampling = load(ExporterConfig).sampling
    assert (sampling.fast_interval_seconds, sampling.slow_interval_seconds) == (2, 30)


def test_names_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, gpumon_port="1234", GPUMON_Sampling__Fast_Interval_Seconds="3")
    config = load(ExporterConfig)
    assert (config.port, config.sampling.fast_interval_seconds) == (1234, 3)


def test_lists_and_mappings_inside_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        GPUMON_PODS__RESOURCE_NAMES='["example.com/gpu"]',
        GPUMON_HEALTH__XID_OVERRIDES__79="healthy",
        GPUMON_PODS__API="false",
    )
    config = load(ExporterConfig)
    assert config.pods.resource_names == ("example.com/gpu",)
    assert config.pods.api is False
    assert dict(config.health.xid_overrides) == {79: HealthState.HEALTHY}


def test_nested_sections_of_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        GPUMON_SIGNALS__DIRECT__ENDPOINTS='{"node-1": "http://10.0.0.1:9842"}',
        GPUMON_SIGNALS__SOURCE="direct",
        GPUMON_LEADER__ENABLED="false",
    )
    config = load(ControllerConfig)
    assert config.signals.source == "direct"
    assert config.signals.direct.endpoints == {"node-1": "http://10.0.0.1:9842"}
    assert config.leader.enabled is False


def test_flags_beat_environment_beat_file_key_by_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "exporter.yaml"
    file.write_text("port: 1111\nsampling:\n  fast_interval_seconds: 4\n  slow_interval_seconds: 40\n")
    _env(monkeypatch, GPUMON_PORT="2222", GPUMON_SAMPLING__FAST_INTERVAL_SECONDS="2")
    config = load(ExporterConfig, flags={"sampling.slow_interval_seconds": "50"}, config_file=file)
    assert config.port == 2222
    assert (config.sampling.fast_interval_seconds, config.sampling.slow_interval_seconds) == (2, 50)
    assert config.model_fields_set == {"port", "sampling"}


def test_variables_naming_no_field_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, GPUMON_NOT_A_FIELD="1", GPUMON_PORT__DEEPER="1")  # port is no section
    assert load(ExporterConfig) == load(ExporterConfig, flags={})


def test_an_unknown_key_inside_a_section_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, GPUMON_SAMPLING__FAST="1")
    with pytest.raises(ConfigError) as e:
        load(ExporterConfig)
    assert "  sampling.fast: Extra inputs are not permitted (got '1'; from $GPUMON_SAMPLING__FAST)" in str(
        e.value
    )


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("GPUMON_SAMPLING", "{", "sampling"),
        ("GPUMON_PODS__RESOURCE_NAMES", "[nvidia.com/gpu", "pods.resource_names"),
    ],
)
def test_json_that_is_not_json_names_the_field_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    _env(monkeypatch, **{variable: value})
    with pytest.raises(ConfigError) as e:
        load(ExporterConfig)
    assert str(e.value).startswith(f"invalid configuration:\n  {field}: ${variable} is not valid JSON: ")


def test_a_key_lands_inside_its_sections_json_whatever_the_environments_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the deeper variable first: read in the environment's order, the JSON replaced it
    _env(monkeypatch, GPUMON_HEALTH__XID_OVERRIDES__79="healthy")
    _env(monkeypatch, GPUMON_HEALTH__XID_OVERRIDES='{"13": "degraded"}')
    overrides = dict(load(ExporterConfig).health.xid_overrides)
    assert overrides == {79: HealthState.HEALTHY, 13: HealthState.DEGRADED}


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        (
            {"GPUMON_PODS__API__X": "1", "GPUMON_PODS__API": "false"},
            "pods.api",
            "$GPUMON_PODS__API__X sets a key inside it, but $GPUMON_PODS__API sets it to a value that is "
            "not a section",
        ),
        (
            {
                "GPUMON_SIGNALS__DIRECT": '{"endpoints": "none"}',
                "GPUMON_SIGNALS__DIRECT__ENDPOINTS__NODE1": "http://10.0.0.1:9842",
            },
            "signals.direct.endpoints",
            "$GPUMON_SIGNALS__DIRECT__ENDPOINTS__NODE1 sets a key inside it, but $GPUMON_SIGNALS__DIRECT "
            "sets it to a value that is not a section",
        ),
    ],
)
def test_a_key_inside_a_plain_value_is_refused_not_dropped(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], field: str, message: str
) -> None:
    _env(monkeypatch, **values)
    model = ControllerConfig if field.startswith("signals") else ExporterConfig
    with pytest.raises(ConfigError) as e:
        load(model)
    assert str(e.value) == f"invalid configuration:\n  {field}: {message}"

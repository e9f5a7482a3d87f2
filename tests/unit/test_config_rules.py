from __future__ import annotations

from pathlib import Path

import pytest
from controller_fakes import load_rules

from gpumon.config import ConfigError, HealthConfig, load
from gpumon.config.controller import ControllerConfig
from gpumon.config.rules import builtin_rules, parse_duration
from gpumon.gpu.health import HealthPolicy, Op, Scope, Severity, Signal


def by_name(rules):
    return {r.name: r for r in rules}


def test_builtins_cover_xid_classes_lost_ecc_remap_and_thermal():
    rules = by_name(load_rules())
    assert set(rules) == {
        "xid-unhealthy",
        "xid-degraded",
        "gpu-lost",
        "ecc-uncorrectable",
        "row-remap-failure",
        "recovery-action",
        "thermal-unhealthy",
        "thermal-degraded",
    }
    assert rules["recovery-action"].severity is Severity.UNHEALTHY
    assert (rules["recovery-action"].op, rules["recovery-action"].threshold) == (Op.GE, 1.0)  # not NONE (0)
    assert rules["xid-unhealthy"].severity is Severity.UNHEALTHY
    assert rules["xid-unhealthy"].xids is None  # classes come from gpu_health
    assert rules["thermal-unhealthy"].threshold == HealthPolicy().temperature_unhealthy_celsius
    assert rules["thermal-degraded"].threshold == HealthPolicy().temperature_degraded_celsius
    assert rules["thermal-degraded"].for_seconds == 300


def test_thermal_builtins_follow_health_config():
    rules = by_name(load_rules(health=HealthConfig(temperature_unhealthy_celsius=90.0)))
    assert rules["thermal-unhealthy"].threshold == 90.0


def test_no_builtins():
    assert load_rules(builtin=False) == ()


def test_builtin_override_is_merged_by_name_and_can_disable():
    rules = by_name(
        load_rules(
            inline=[
                {"name": "thermal-degraded", "for": "1m", "recoverAfter": "2m"},
                {"name": "xid-degraded", "enabled": False},
            ]
        )
    )
    assert "xid-degraded" not in rules
    t = rules["thermal-degraded"]
    assert (t.threshold, t.for_seconds, t.recover_after_seconds, t.signal) == (
        87.0,
        60.0,
        120.0,
        Signal.TEMPERATURE,
    )


def test_full_rule_from_file(tmp_path: Path):
    f = tmp_path / "rules.yaml"
    f.write_text(
        """
rules:
  - name: nvlink-down
    signal: promql
    query: sum by (node) (gpumon_nvlink_down)
    op: ">"
    threshold: 0
    for: 1m30s
    recover_after: 1h
    severity: unhealthy
    scope: node
    nodeSelector: {gpu.example.com/class: training}
    pools: [a100]
    action: reseat the NVLink bridge
  - name: health-from-exporter
    signal: exporter_health
    threshold: unhealthy
    severity: unhealthy
  - name: fatal-only
    signal: xid
    xids: [79]
    severity: unhealthy
    reason: FellOffTheBus
"""
    )
    rules = by_name(load_rules(rules_file=f, builtin=False, default_recover_after_seconds=60))
    nv = rules["nvlink-down"]
    assert nv.signal is Signal.PROMQL and nv.scope is Scope.NODE and nv.op is Op.GT
    assert (nv.for_seconds, nv.recover_after_seconds, nv.threshold) == (90.0, 3600.0, 0.0)
    assert dict(nv.node_selector) == {"gpu.example.com/class": "training"}
    assert nv.pools == frozenset({"a100"})
    assert nv.reason is None and nv.action == "reseat the NVLink bridge"
    assert rules["health-from-exporter"].threshold == 2.0  # rank of "unhealthy"
    assert rules["health-from-exporter"].recover_after_seconds == 60
    assert rules["fatal-only"].xids == frozenset({79})
    assert rules["fatal-only"].reason == "FellOffTheBus"


def test_inline_overrides_file(tmp_path: Path):
    f = tmp_path / "rules.yaml"
    f.write_text("rules:\n  - {name: hot, signal: temperature, threshold: 90, severity: degraded}\n")
    rules = by_name(load_rules(rules_file=f, inline=[{"name": "hot", "threshold": 91}], builtin=False))
    assert rules["hot"].threshold == 91.0


@pytest.mark.parametrize(
    ("rule", "field", "words"),
    [
        ({"name": "r", "signal": "temp", "severity": "unhealthy"}, "signal", "temperature"),
        ({"name": "r", "signal": "temperature", "severity": "unhealthy"}, "threshold", "required"),
        ({"name": "r", "signal": "temperature", "threshold": 1, "severity": "bad"}, "severity", "degraded"),
        (
            {"name": "r", "signal": "temperature", "threshold": 1, "severity": "degraded", "for": "5x"},
            "for",
            "5x",
        ),
        (
            {"name": "r", "signal": "temperature", "threshold": "hot", "severity": "degraded"},
            "threshold",
            "number",
        ),
        ({"name": "r", "signal": "xid", "threshold": 3, "severity": "degraded"}, "threshold", "xids"),
        (
            {"name": "r", "signal": "temperature", "threshold": 1, "severity": "degraded", "xids": [79]},
            "xids",
            "",
        ),
        ({"name": "r", "signal": "promql", "threshold": 1, "severity": "degraded"}, "query", "required"),
        ({"name": "r", "signal": "gpu_lost", "severity": "degraded", "query": "up"}, "query", "promql"),
        ({"name": "r", "signal": "exporter_health", "severity": "degraded"}, "threshold", "lost"),
        (
            {"name": "r", "signal": "exporter_health", "threshold": "meh", "severity": "degraded"},
            "threshold",
            "",
        ),
        ({"name": "r", "signal": "gpu_lost", "severity": "degraded", "reason": "not camel"}, "reason", ""),
        ({"name": "r", "signal": "gpu_lost", "severity": "degraded", "colour": "red"}, "colour", "Extra"),
        ({"name": "R_", "signal": "gpu_lost", "severity": "degraded"}, "name", ""),
        ({"name": "r", "signal": "gpu_lost", "severity": "degraded", "op": "=>"}, "op", ""),
        ({"name": "r", "signal": "gpu_lost", "severity": "degraded", "scope": "rack"}, "scope", ""),
    ],
)
def test_bad_rule_names_rule_and_field(rule, field, words):
    with pytest.raises(ConfigError) as e:
        load_rules(inline=[rule], builtin=False)
    msg = str(e.value)
    assert f"rule {rule['name']!r}" in msg
    assert f"  {field}: " in msg
    assert words in msg


def test_bad_override_of_builtin_names_the_builtin():
    with pytest.raises(ConfigError, match=r"rule 'thermal-degraded'.*\n  threshold: "):
        load_rules(inline=[{"name": "thermal-degraded", "threshold": "warm"}])


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("thermal-degraded", "threshold", 85),
        ("thermal-unhealthy", "op", ">"),
        ("thermal-unhealthy", "severity", "degraded"),
        ("xid-degraded", "severity", "unhealthy"),
        ("xid-unhealthy", "xids", [79]),
        ("gpu-lost", "scope", "node"),
        ("ecc-uncorrectable", "signal", "gpu_lost"),
    ],
)
def test_what_a_builtin_judges_is_the_health_section(tmp_path: Path, name: str, key: str, value: object):
    # The exporters judge with policy.health too: a built-in re-judged by name would be a second
    # judgement of one GPU. Refused wherever the override is written.
    with pytest.raises(ConfigError, match=rf"rule {name!r} \(policy.rules\[0\]\):\n  {key}: .*policy.health"):
        load_rules(inline=[{"name": name, key: value}])
    f = tmp_path / "rules.yaml"
    f.write_text(f"rules:\n  - {{name: {name}, {key}: {value!r}}}\n".replace("'", '"'))
    with pytest.raises(ConfigError, match=rf"rule {name!r} \({f}: rules\[0\]\):\n  {key}: "):
        load_rules(rules_file=f)


def test_when_where_and_how_a_builtin_speaks_stay_the_controllers():
    override = {"for": "10m", "recoverAfter": "1h", "nodeSelector": {"a": "b"}, "pools": ["p"]}
    words = {"reason": "TooHot", "action": "check the fans"}
    (rule,) = [
        r
        for r in load_rules(inline=[{"name": "thermal-degraded", **override, **words}])
        if r.name == "thermal-degraded"
    ]
    assert (rule.threshold, rule.for_seconds, rule.reason) == (87.0, 600.0, "TooHot")
    # Without the built-ins the name is free: the rule is the config's own.
    (own,) = load_rules(
        builtin=False,
        inline=[
            {"name": "thermal-degraded", "signal": "temperature", "threshold": 80, "severity": "degraded"}
        ],
    )
    assert own.threshold == 80.0


def test_unnamed_and_duplicate_rules(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"policy.rules\[1\]:\n  name: Field required"):
        load_rules(
            inline=[{"name": "a", "signal": "gpu_lost", "severity": "degraded"}, {"signal": "gpu_lost"}]
        )
    f = tmp_path / "r.yaml"
    f.write_text(
        "rules:\n"
        "  - {name: a, signal: gpu_lost, severity: degraded}\n"
        "  - {name: a, signal: xid, severity: degraded}\n"
    )
    with pytest.raises(ConfigError, match="defined twice"):
        load_rules(rules_file=f)


def test_rules_file_problems(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_rules(rules_file=tmp_path / "missing.yaml")
    f = tmp_path / "r.yaml"
    f.write_text("rulez: []\n")
    with pytest.raises(ConfigError, match="unknown top-level keys"):
        load_rules(rules_file=f)
    f.write_text("rules: {a: 1}\n")
    with pytest.raises(ConfigError, match="must be a list"):
        load_rules(rules_file=f)
    f.write_text("rules: [3]\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_rules(rules_file=f)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("2m", 120.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1d", 86400.0), (7, 7)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_builtins_are_fresh_dicts():
    a = builtin_rules(HealthPolicy())
    a[0]["severity"] = "degraded"
    assert builtin_rules(HealthPolicy())[0]["severity"] == "unhealthy"


def test_rules_file_is_read_and_validated_when_config_loads(tmp_path: Path):
    f = tmp_path / "rules.yaml"
    f.write_text("rules:\n  - {name: gpu-hot, signal: temperature, severity: degraded}\n")
    with pytest.raises(
        ConfigError, match=r"invalid rule 'gpu-hot' \(.*rules.yaml: rules\[0\]\):\n  threshold: required"
    ):
        load(ControllerConfig, flags={"policy.rules_file": str(f)})
    f.write_text("rules:\n  - {name: gpu-hot, signal: temperature, severity: degraded, threshold: 90}\n")
    config = load(ControllerConfig, flags={"policy.rules_file": str(f)})
    assert "gpu-hot" in {r.name for r in config.policy.effective_rules}

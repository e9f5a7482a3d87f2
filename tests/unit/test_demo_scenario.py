"""The demo's scenario file: the embedded default, overrides, and readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.config import ConfigError
from gpumon.demo import scenario
from gpumon.demo.scenario import Expect


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_the_embedded_default_plays_the_six_steps_in_order() -> None:
    s = scenario.load(None)
    assert [st.expect for st in s.steps] == [
        Expect.STEADY,
        Expect.QUARANTINED,
        Expect.SCALED_UP,
        Expect.REPAIRED,
        Expect.REPLACED,
        Expect.SCALED_DOWN,
    ]
    assert s.steps[1].inject is not None and s.steps[1].inject.fault == "ecc"
    assert s.steps[2].scale == 12 and s.steps[3].repair and s.steps[5].scale == 2
    flap = s.steps[4].inject
    assert flap is not None and flap.again and flap.body(1) == {"fault": "ecc", "gpu": 1}
    assert s.repairs and s.replaces, "the pool's repair ladder is on, its last rung too"
    assert s.with_pool_nodes(5).fleet.pool_nodes == 5 and s.fleet.pool_nodes == 3


def test_an_inject_becomes_the_exporters_fault_body_on_the_chosen_gpu(tmp_path: Path) -> None:
    s = scenario.load(
        _write(
            tmp_path,
            """
steps:
  - {name: hot, inject: {fault: overheat, celsius: 99, node: gpu-pool-1}, expect: quarantined}
""",
        )
    )
    inject = s.steps[0].inject
    assert inject is not None and inject.node == "gpu-pool-1" and inject.gpu is None
    assert inject.body(2) == {"fault": "overheat", "gpu": 2, "celsius": 99}


ONE = "steps:\n  - {name: a, expect: steady}"


def _step(body: str) -> str:
    return "steps:\n  - {name: a, " + body + "}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("steps: []", "steps: List should have at least 1 item"),
        (_step("inject: {fault: xid}, expect: quarantined"), "steps.0.inject: xid.code: Field required"),
        (_step("inject: {fault: melt}, expect: quarantined"), "steps.0.inject:"),
        (_step("inject: {fault: clear}, expect: steady"), "use `clear: true`"),
        (_step("scale: 2, clear: true, expect: steady"), "a step does one thing; this one has clear, scale"),
        (_step("expect: recovered"), "steps.0 (a): recovered needs an earlier step"),
        (_step("repair: true, expect: repaired"), "steps.0 (a): repair needs an earlier step"),
        (
            "steps:\n  - {name: a, inject: {fault: ecc}, expect: quarantined}\n"
            "  - {name: b, expect: repaired}",
            "steps.1 (b): repaired needs a repair step",
        ),
        (_step("repair: true, scale: 2, expect: steady"), "this one has repair, scale"),
        (
            _step("inject: {fault: ecc, again: true, gpu: 1}, expect: quarantined"),
            "give no node or gpu with it",
        ),
        (
            _step("inject: {fault: ecc, again: true}, expect: replaced"),
            "inject.again needs an earlier step that expects repaired",
        ),
        (
            "steps:\n  - {name: a, inject: {fault: ecc}, expect: quarantined}\n"
            "  - {name: b, expect: replaced}",
            "steps.1 (b): replaced needs this step to inject a fault",
        ),
        (ONE + "\n  - {name: a, expect: steady}", "step names must be unique: a"),
        ("workload: {gpus_per_pod: 8}\n" + ONE, "exceeds fleet.gpus_per_node"),
        ("fleet: {pool_nodes: 0}\n" + ONE, "fleet.pool_nodes: Input should be greater"),
        (_step("expect: melted"), "steps.0.expect: Input should be 'steady'"),
        ("surprise: 1\n" + ONE, "surprise: Extra inputs are not permitted"),
    ],
)
def test_a_bad_file_is_one_message_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        scenario.load(path)
    assert str(e.value).startswith(f"invalid scenario {path}:\n")
    assert message in str(e.value)


def test_a_missing_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        scenario.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        scenario.load(_write(tmp_path, "steps: [\n"))

"""The one judgement of a GPU (gpumon/gpu/health.py): its tables, its one converter from config,
and that the exporter's verdict and the controller's rules agree on every Xid of the catalog and
on a temperature under the same configuration."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_controller_policy import Run, gpu, node

from gpumon.config import ExporterConfig, HealthConfig
from gpumon.config.controller import ControllerConfig, PolicyConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.policy import EMPTY_NODE_STATE, evaluate_node
from gpumon.gpu.health import (
    ACTION_XIDS,
    INFORMATIONAL_XIDS,
    REASONS,
    RECOVERY_REASONS,
    XID_RESOLUTIONS,
    HealthPolicy,
    Severity,
    Signal,
    XidClass,
    classify_xid,
    default_reason,
    documented_resolution,
    judge,
    recommended_action,
)
from gpumon.gpu.model import FastFields, HealthState, RecoveryAction, SlowFields, XidEvent
from gpumon.wire import v1 as wire

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The catalog, plus codes it does not know (unknown_xid_state applies to them).
CODES = sorted(INFORMATIONAL_XIDS | set(ACTION_XIDS) | {1, 8, 999})


def test_every_reason_code_has_one_entry_and_every_signal_a_default():
    for k in ACTION_XIDS.values():
        assert k.reason in REASONS
    for code in ("XidUnknown", "XidInformational", "Xid", "Thermal", "GpuLost"):
        assert code in REASONS
    assert {s: default_reason(s) for s in Signal} == {
        Signal.TEMPERATURE: "Thermal",
        Signal.XID: "XidFatal",
        Signal.ECC_UNCORRECTABLE: "EccUncorrectable",
        Signal.ROW_REMAP_FAILURE: "RowRemapFailure",
        Signal.GPU_LOST: "GpuLost",
        Signal.MEMORY_UTILIZATION: "MemoryUtilization",
        Signal.EXPORTER_HEALTH: "ExporterVerdict",
        Signal.RECOVERY_ACTION: "GpuRecoveryAction",
        Signal.PROMQL: "Custom",
    }
    assert "reset the GPU" in recommended_action("XidFatal")
    assert recommended_action("SomethingOfMine") == "investigate the GPU"


def test_severity_is_derived_from_the_health_state_in_one_place():
    assert [Severity.of(s) for s in HealthState] == [
        None,
        Severity.DEGRADED,
        Severity.UNHEALTHY,
        Severity.UNHEALTHY,
    ]


def test_overrides_change_the_class_and_keep_the_catalog_reason():
    p = HealthPolicy(
        xid_overrides={13: HealthState.UNHEALTHY, 79: HealthState.HEALTHY, 63: HealthState.UNHEALTHY},
        unknown_xid_state=HealthState.HEALTHY,
    )
    assert classify_xid(13, p) == XidClass(HealthState.UNHEALTHY, "XidFatal")
    assert classify_xid(79, p).state is HealthState.HEALTHY
    assert classify_xid(63, p) == XidClass(HealthState.UNHEALTHY, "RowRemapPending")
    assert classify_xid(999, p).severity is None
    assert classify_xid(999, HealthPolicy()) == XidClass(HealthState.DEGRADED, "XidUnknown")


def test_one_converter_for_both_programs():
    section = {
        "xid_overrides": {13: "unhealthy", 79: "healthy"},
        "unknown_xid_state": "unhealthy",
        "xid_window_seconds": 30,
        "temperature_degraded_celsius": 80,
        "temperature_unhealthy_celsius": 90,
    }
    expected = HealthPolicy(
        xid_overrides={13: HealthState.UNHEALTHY, 79: HealthState.HEALTHY},
        unknown_xid_state=HealthState.UNHEALTHY,
        xid_window_seconds=30.0,
        temperature_degraded_celsius=80.0,
        temperature_unhealthy_celsius=90.0,
    )
    exporter = ExporterConfig.model_validate({"health": section})
    controller = ControllerConfig.model_validate({"policy": {"health": section}})
    assert exporter.health.policy() == expected
    # The controller judges Xids with the very value the exporter's sampler gets.
    assert build_policy(controller).health == exporter.health.policy()


states = st.sampled_from(list(HealthState))


@PROPERTY
@given(
    codes=st.frozensets(st.sampled_from(CODES), max_size=4),
    overrides=st.dictionaries(st.sampled_from(CODES), states, max_size=4),
    unknown=states,
)
def test_exporter_verdict_and_controller_rules_agree_on_every_catalog_xid(
    codes: frozenset[int], overrides: dict[int, HealthState], unknown: HealthState
):
    health = HealthConfig(xid_overrides=overrides, unknown_xid_state=unknown)
    config = ControllerConfig(policy=PolicyConfig(health=health))
    exporter = judge(
        fast=None,
        slow=None,
        recent_xids=[XidEvent("GPU-0", c, 10.0) for c in codes],
        lost=False,
        now=10.0,
        policy=health.policy(),
    )
    pol = build_policy(config)
    controller = evaluate_node(
        "n1", {}, node(10.0, gpu(at=10.0, xid_codes=codes)), EMPTY_NODE_STATE, 10.0, pol
    ).verdict

    assert controller.severity is Severity.of(exporter.state)
    if controller.severity is None:
        return
    findings = controller.findings
    assert findings[0].reason == exporter.reason
    named = {int(c) for f in findings for c in f.evidence.removeprefix("Xid ").split(", ")}
    assert named == {int(c) for r in exporter.reasons for c in r.detail.removeprefix("Xid ").split(", ")}


@PROPERTY
@given(
    degraded=st.integers(min_value=60, max_value=100),
    gap=st.integers(min_value=0, max_value=20),
    temperature=st.integers(min_value=40, max_value=130),
)
def test_exporter_verdict_and_controller_rules_agree_on_a_temperature(
    degraded: int, gap: int, temperature: int
):
    # The thermal thresholds, like the Xid classes, come from one health section: the exporter
    # judges a temperature at once, the controller's thermal rules once it held for their `for`
    # (5 minutes at most), and both then name the same severity.
    health = HealthConfig(temperature_degraded_celsius=degraded, temperature_unhealthy_celsius=degraded + gap)
    exporter = judge(
        fast=FastFields(temperature_gpu_celsius=float(temperature)),
        slow=None,
        recent_xids=(),
        lost=False,
        now=0.0,
        policy=health.policy(),
    )
    run = Run(build_policy(ControllerConfig(policy=PolicyConfig(health=health))))
    for t in range(0, 361, 30):
        controller = run(float(t), node(float(t), gpu(at=float(t), temperature_celsius=float(temperature))))
    assert controller.verdict.severity is Severity.of(exporter.state)


def test_a_storm_of_distinct_codes_gives_one_reason_per_class_within_the_wire_limit():
    # Issue #18: 64 distinct codes in the window gave 64 reasons, one gpumon_gpu_health_info
    # series each (507 on a stormed node), and a verdict the wire refused (MAX_REASONS = 32),
    # so the stormed GPU's watch lines and snapshot could not be built.
    storm = [XidEvent("GPU-0", c, 10.0) for c in (*range(200, 262), 79, 74)]
    verdict = judge(fast=None, slow=None, recent_xids=storm, lost=False, now=10.0, policy=HealthPolicy())
    assert [(r.code, r.state) for r in verdict.reasons] == [
        ("XidFatal", HealthState.UNHEALTHY),
        ("XidUnknown", HealthState.DEGRADED),
    ]
    assert verdict.reasons[0].detail == "Xid 74, 79"
    assert verdict.reasons[1].detail == "Xid " + ", ".join(map(str, range(200, 262)))
    assert wire.Verdict.model_validate(verdict, from_attributes=True).reasons[0].detail == "Xid 74, 79", (
        "within the wire's limits"
    )


@PROPERTY
@given(action=st.sampled_from(RecoveryAction))
def test_exporter_verdict_and_controller_rules_agree_on_every_recovery_action(action: RecoveryAction):
    exporter = judge(
        fast=None,
        slow=SlowFields(recovery_action=action),
        recent_xids=(),
        lost=False,
        now=10.0,
        policy=HealthPolicy(),
    )
    controller = evaluate_node(
        "n1",
        {},
        node(10.0, gpu(at=10.0, recovery_action=action)),
        EMPTY_NODE_STATE,
        10.0,
        build_policy(ControllerConfig()),
    ).verdict
    if action is RecoveryAction.NONE:
        assert exporter.state is HealthState.HEALTHY and controller.severity is None
        return
    assert exporter.state is HealthState.UNHEALTHY and controller.severity is Severity.UNHEALTHY
    assert exporter.reason == controller.findings[0].reason == RECOVERY_REASONS[action]
    assert (
        exporter.reasons[0].detail
        == controller.findings[0].evidence
        == f"driver recovery action {action.name}"
    )


def test_every_recovery_action_but_none_has_a_reason_of_its_own():
    assert set(RECOVERY_REASONS) == set(RecoveryAction) - {RecoveryAction.NONE}
    assert len(set(RECOVERY_REASONS.values())) == len(RECOVERY_REASONS)
    assert all(code in REASONS for code in RECOVERY_REASONS.values())


def test_the_catalog_stands_in_for_a_driver_without_the_recovery_action():
    assert set(XID_RESOLUTIONS) <= set(ACTION_XIDS), "only codes that call for action"
    assert documented_resolution([13, 43]) is RecoveryAction.NONE, "application faults: nothing to repair"
    assert documented_resolution([48]) is RecoveryAction.GPU_RESET
    assert documented_resolution([48, 79]) is RecoveryAction.NODE_REBOOT, "the heaviest of them"
    assert documented_resolution([], lost=True) is RecoveryAction.NODE_REBOOT
    assert documented_resolution([], reasons=["EccUncorrectable"]) is RecoveryAction.GPU_RESET
    assert documented_resolution([], reasons=["Thermal", "Custom"]) is RecoveryAction.NONE
    assert documented_resolution([79], reasons=["EccUncorrectable"]) is RecoveryAction.NODE_REBOOT

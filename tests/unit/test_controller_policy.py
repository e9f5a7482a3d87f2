from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import pytest
from controller_fakes import load_rules

from gpumon.controller.core.contract.node import GpuRecord
from gpumon.controller.core.policy import (
    EMPTY_NODE_STATE,
    NODE_TARGET,
    NodeEvaluation,
    NodeRuleState,
    Policy,
    evaluate_node,
    restore_state,
    signal_status,
)
from gpumon.controller.core.signals import FleetSignals, GpuReading, NodeReading, XidSeen
from gpumon.controller.core.verdicts import SignalStatus
from gpumon.gpu.health import HealthPolicy, Severity
from gpumon.gpu.model import HealthReason, HealthState, HealthVerdict, RecoveryAction


def gpu(index: int = 0, at: float = 0.0, **kw) -> GpuReading:
    base = dict(
        temperature_celsius=40.0,
        memory_utilization_ratio=0.1,
        ecc_uncorrectable=0,
        row_remap_failure=False,
        lost=False,
        xids=(),
        health=HealthVerdict(HealthState.HEALTHY),
    )
    # Codes seen at the reading's own time.
    base["xids"] = tuple(XidSeen(c, at) for c in sorted(kw.pop("xid_codes", ())))
    base.update(kw)
    return GpuReading(uuid=f"GPU-{index}", index=index, observed_at=at, **base)


def node(at: float, *gpus: GpuReading, name: str = "n1", **kw) -> NodeReading:
    return NodeReading(node=name, observed_at=at, gpus=gpus or (gpu(at=at),), **kw)


def policy(rules=None, **kw) -> Policy:
    return Policy(rules=load_rules(**(rules or {})), **kw)


class Run:
    """Feeds readings to evaluate_node one step at a time, threading the state."""

    def __init__(self, pol: Policy, labels=None, state: NodeRuleState = EMPTY_NODE_STATE):
        self.pol = pol
        self.labels = labels or {}
        self.state = state

    def __call__(self, now: float, reading: NodeReading | None) -> NodeEvaluation:
        ev = evaluate_node("n1", self.labels, reading, self.state, now, self.pol)
        self.state = ev.state
        return ev


def hot(t: float, c: float = 96.0) -> NodeReading:
    return node(t, gpu(at=t, temperature_celsius=c))


def cool(t: float) -> NodeReading:
    return hot(t, 40.0)


def test_healthy_node_has_no_verdict_and_no_state_but_is_checked_again_when_its_data_would_go_stale():
    pol = policy()
    ev = Run(pol)(10.0, node(10.0))
    assert ev.verdict.severity is None
    assert ev.verdict.signals is SignalStatus.FRESH
    assert ev.state.targets == {}
    # A healthy node whose exporter goes dark must be noticed without any other event: not by
    # evaluating it again, by comparing the source's latest reading with this time.
    assert ev.next_check_at is None
    assert ev.stale_at == math.nextafter(10.0 + pol.stale_after_seconds, math.inf)
    assert signal_status(node(10.0), ev.stale_at - 1e-9, pol)[0] is SignalStatus.FRESH
    assert signal_status(node(10.0), ev.stale_at, pol)[0] is SignalStatus.STALE


def test_fatal_xid_fires_at_once_with_reason_evidence_and_first_seen():
    ev = Run(policy())(12.0, node(11.5, gpu(0, 11.5), gpu(3, 11.5, xid_codes=frozenset({79}))))
    v = ev.verdict
    assert v.severity is Severity.UNHEALTHY
    assert [g.uuid for g in v.gpus] == ["GPU-3"]
    f = v.gpus[0].findings[0]
    assert (f.rule, f.reason, f.evidence) == ("xid-unhealthy", "XidFatal", "Xid 79")
    assert f.first_bad_at == 11.5 and f.since == 12.0
    assert "reset the GPU" in f.action
    assert v.first_bad_at == 11.5
    assert not v.whole_node


@pytest.mark.parametrize(
    ("xid", "severity", "reason"),
    [
        (13, None, None),  # informational: application fault
        (31, None, None),
        (43, None, None),
        (48, Severity.UNHEALTHY, "EccUncorrectable"),
        (63, Severity.DEGRADED, "RowRemapPending"),
        (64, Severity.UNHEALTHY, "RowRemapFailure"),
        (92, Severity.DEGRADED, "EccHighSingleBitRate"),
        (94, Severity.DEGRADED, "EccContained"),
        (95, Severity.UNHEALTHY, "EccUncorrectable"),
        (119, Severity.UNHEALTHY, "XidFatal"),
        (999, Severity.DEGRADED, "XidUnknown"),  # unknown codes count as degraded
    ],
)
def test_xid_classes_follow_nvidia_catalog(xid, severity, reason):
    v = Run(policy())(1.0, node(1.0, gpu(at=1.0, xid_codes=frozenset({xid})))).verdict
    assert v.severity is severity
    if reason:
        assert v.findings[0].reason == reason


def test_xid_class_overrides():
    classes = HealthPolicy(xid_overrides={13: HealthState.UNHEALTHY, 79: HealthState.HEALTHY})
    pol = policy(health=classes)
    assert Run(pol)(1.0, node(1.0, gpu(at=1.0, xid_codes=frozenset({79})))).verdict.severity is None
    v = Run(pol)(1.0, node(1.0, gpu(at=1.0, xid_codes=frozenset({13})))).verdict
    assert v.severity is Severity.UNHEALTHY


def test_worst_finding_first_and_several_xids_in_evidence():
    v = Run(policy())(1.0, node(1.0, gpu(at=1.0, xid_codes=frozenset({63, 79, 74})))).verdict
    g = v.gpus[0]
    assert [f.rule for f in g.findings] == ["xid-unhealthy", "xid-degraded"]
    assert g.findings[0].evidence == "Xid 74, 79"
    assert g.severity is Severity.UNHEALTHY


def test_lost_ecc_remap_and_exporter_verdict_signals():
    pol = policy(
        {
            "inline": [
                {
                    "name": "exp",
                    "signal": "exporter_health",
                    "threshold": "unhealthy",
                    "severity": "unhealthy",
                }
            ]
        }
    )
    bad = HealthVerdict(
        HealthState.UNHEALTHY, (HealthReason("EccUncorrectable", "2 uncorrectable", HealthState.UNHEALTHY),)
    )
    reading = node(
        1.0,
        gpu(0, 1.0, lost=True, temperature_celsius=None),
        gpu(1, 1.0, ecc_uncorrectable=2),
        gpu(2, 1.0, row_remap_failure=True),
        gpu(3, 1.0, health=bad),
    )
    v = Run(pol)(1.0, reading).verdict
    reasons = {g.index: g.findings[0].reason for g in v.gpus}
    assert reasons == {0: "GpuLost", 1: "EccUncorrectable", 2: "RowRemapFailure", 3: "EccUncorrectable"}
    assert v.gpus[3].findings[0].rule == "exp"
    assert "exporter verdict unhealthy: 2 uncorrectable" in v.gpus[3].findings[0].evidence


def test_a_recovery_action_other_than_none_is_unhealthy_with_a_reason_naming_it():
    run = Run(policy(stale_after_seconds=1e9))
    reading = node(
        1.0,
        gpu(0, 1.0, recovery_action=RecoveryAction.NONE),
        gpu(1, 1.0, recovery_action=RecoveryAction.GPU_RESET),
        gpu(2, 1.0, recovery_action=RecoveryAction.SYSTEM_REBOOT),
        gpu(3, 1.0),  # the driver does not report it: unknown, nothing to judge
    )
    v = run(1.0, reading).verdict
    assert v.severity is Severity.UNHEALTHY
    found = {g.index: g.findings[0] for g in v.gpus}
    assert set(found) == {1, 2}
    assert (found[1].rule, found[1].reason, found[1].evidence) == (
        "recovery-action",
        "RecoveryGpuReset",
        "driver recovery action GPU_RESET",
    )
    assert found[2].reason == "RecoverySystemReboot"
    assert "reboot" in found[2].action

    # The driver says NONE again after the reset: recovery through the usual hysteresis.
    def cleared(t: float) -> NodeReading:
        return node(t, *(gpu(i, t, recovery_action=RecoveryAction.NONE) for i in range(4)))

    assert run(2.0, cleared(2.0)).verdict.recovering
    assert run(902.0, cleared(902.0)).verdict.severity is None


def test_for_duration_delays_firing_and_resets_when_condition_breaks():
    run = Run(policy())
    ev = run(0.0, hot(0.0))
    assert ev.verdict.severity is None
    assert ev.next_check_at == 60.0  # thermal-unhealthy's `for`
    assert run(59.0, hot(59.0)).verdict.severity is None
    ev = run(60.0, hot(60.0))
    assert ev.verdict.severity is Severity.UNHEALTHY
    f = ev.verdict.findings[0]
    assert (f.reason, f.first_bad_at, f.since) == ("Thermal", 0.0, 60.0)
    assert f.evidence == "temperature 96 C >= 95 C"

    run = Run(policy())
    run(0.0, hot(0.0))
    run(30.0, cool(30.0))  # broken: the `for` starts again
    run(45.0, hot(45.0))
    assert run(100.0, hot(100.0)).verdict.severity is None
    assert run(105.0, hot(105.0)).verdict.severity is Severity.UNHEALTHY


def test_recovery_waits_for_recover_after_and_restarts_when_bad_again():
    run = Run(policy(stale_after_seconds=1e9))
    run(0.0, node(0.0, gpu(at=0.0, xid_codes=frozenset({79}))))
    ev = run(100.0, node(100.0))
    assert ev.verdict.severity is Severity.UNHEALTHY and ev.verdict.recovering
    assert ev.next_check_at == 1000.0
    assert run(999.0, node(999.0)).verdict.severity is Severity.UNHEALTHY
    ev = run(1000.0, node(1000.0))
    assert ev.verdict.severity is None
    # A bad observation during the hysteresis restarts it.
    run = Run(policy())
    run(0.0, node(0.0, gpu(at=0.0, xid_codes=frozenset({79}))))
    run(100.0, node(100.0))
    v = run(500.0, node(500.0, gpu(at=500.0, xid_codes=frozenset({79})))).verdict
    assert not v.recovering
    run(600.0, node(600.0))
    assert run(1400.0, node(1400.0)).verdict.severity is Severity.UNHEALTHY
    assert run(1500.0, node(1500.0)).verdict.severity is None


def test_xids_count_within_the_controllers_own_window():
    pol = policy(health=HealthPolicy(xid_window_seconds=900.0))
    fatal = (XidSeen(79, 1000.0),)
    # Seen 700 s before the reading: an exporter's 600 s window would have dropped it, ours keeps it.
    v = Run(pol)(1700.0, node(1700.0, gpu(at=1700.0, xids=fatal))).verdict
    assert v.severity is Severity.UNHEALTHY and v.findings[0].evidence == "Xid 79"
    assert Run(pol)(1901.0, node(1901.0, gpu(at=1901.0, xids=fatal))).verdict.severity is None
    # Each code counts from its own time; an old code does not hold the rule.
    mixed = (XidSeen(79, 0.0), XidSeen(13, 1000.0))
    assert Run(pol)(1000.0, node(1000.0, gpu(at=1000.0, xids=mixed))).verdict.severity is None
    # No Xid signal at all (the source cannot tell) is unknown, not "none".
    assert Run(pol)(1.0, node(1.0, gpu(at=1.0, xids=None))).state.targets == {}


def test_stale_or_missing_signals_never_start_remediation():
    pol = policy(stale_after_seconds=30.0)
    ev = Run(pol)(100.0, node(50.0, gpu(at=50.0, xid_codes=frozenset({79}))))
    assert ev.verdict.signals is SignalStatus.STALE
    assert ev.verdict.severity is None and ev.state.targets == {}
    assert ev.verdict.age_seconds == 50.0
    ev = Run(pol)(100.0, None)
    assert ev.verdict.signals is SignalStatus.MISSING and ev.verdict.age_seconds is None
    # A `for` in progress is abandoned when data goes stale.
    run = Run(pol)
    run(0.0, hot(0.0))
    run(40.0, hot(0.0))  # same reading, now stale
    assert run(61.0, hot(61.0)).verdict.severity is None
    assert run(121.0, hot(121.0)).verdict.severity is Severity.UNHEALTHY


def test_stale_signals_hold_a_firing_verdict_and_restart_recovery():
    pol = policy(stale_after_seconds=30.0)
    run = Run(pol)
    run(0.0, node(0.0, gpu(at=0.0, xid_codes=frozenset({79}))))
    run(100.0, node(100.0))  # clearing from 100
    ev = run(500.0, node(100.0))  # stale: unknown, clearing restarts
    assert ev.verdict.severity is Severity.UNHEALTHY and not ev.verdict.recovering
    ev = run(1000.0, None)  # missing: still held
    assert ev.verdict.severity is Severity.UNHEALTHY
    run(1100.0, node(1100.0))
    assert run(1999.0, node(1999.0)).verdict.severity is Severity.UNHEALTHY
    assert run(2000.0, node(2000.0)).verdict.severity is None


def test_missing_field_is_unknown_for_its_rules_only():
    run = Run(policy())
    run(0.0, hot(0.0))
    ev = run(60.0, node(60.0, gpu(at=60.0, temperature_celsius=None, ecc_uncorrectable=3)))
    assert [f.rule for f in ev.verdict.findings] == ["ecc-uncorrectable"]  # thermal `for` was reset


def test_gpu_reading_lagging_its_node_is_unknown():
    pol = policy(stale_after_seconds=30.0)
    v = Run(pol)(100.0, node(100.0, gpu(at=10.0, xid_codes=frozenset({79})))).verdict
    assert v.signals is SignalStatus.FRESH and v.severity is None


def test_gpu_that_vanishes_while_firing_is_held():
    run = Run(policy())
    run(0.0, node(0.0, gpu(0, 0.0), gpu(1, 0.0, lost=True)))
    ev = run(2000.0, node(2000.0, gpu(0, 2000.0)))
    assert [g.uuid for g in ev.verdict.gpus] == ["GPU-1"]
    assert ev.verdict.gpus[0].index == 1


def test_flapping_gpu_is_held_until_old_onsets_age_out():
    pol = policy(
        {
            "builtin": False,
            "inline": [{"name": "x", "signal": "gpu_lost", "severity": "unhealthy", "recoverAfter": 10}],
        },
        flap_window_seconds=1000.0,
        flap_max_onsets=3,
        stale_after_seconds=1e9,
    )
    run = Run(pol)
    lost = lambda t: node(t, gpu(at=t, lost=True))  # noqa: E731
    for start in (0.0, 100.0):
        run(start, lost(start))
        run(start + 1, node(start + 1))
        assert run(start + 11, node(start + 11)).verdict.severity is None
    run(200.0, lost(200.0))  # third onset within the window
    ev = run(201.0, node(201.0))
    assert ev.verdict.gpus[0].flapping
    ev = run(500.0, node(500.0))
    assert ev.verdict.severity is Severity.UNHEALTHY and ev.verdict.gpus[0].flapping
    assert ev.next_check_at == 1000.0  # when the first onset leaves the window
    assert run(1000.0, node(1000.0)).verdict.severity is None


def test_node_scoped_promql_rule():
    pol = policy(
        {
            "builtin": False,
            "inline": [
                {
                    "name": "nvlink-down",
                    "signal": "promql",
                    "query": "x",
                    "op": ">",
                    "threshold": 0,
                    "severity": "unhealthy",
                    "scope": "node",
                }
            ],
        }
    )
    v = Run(pol)(1.0, node(1.0, custom=MappingProxyType({"nvlink-down": 2.0}))).verdict
    assert v.whole_node and v.severity is Severity.UNHEALTHY and v.gpus == ()
    assert v.node_findings[0].reason == "Custom" and v.node_findings[0].evidence == "nvlink-down 2 > 0"
    assert Run(pol)(1.0, node(1.0)).verdict.severity is None  # absent from the result: fine


def test_gpu_scoped_promql_rule_and_absent_series():
    pol = policy(
        {
            "builtin": False,
            "inline": [
                {"name": "p", "signal": "promql", "query": "x", "threshold": 5, "severity": "degraded"}
            ],
        }
    )
    reading = node(1.0, gpu(0, 1.0, custom=MappingProxyType({"p": 7.0})), gpu(1, 1.0))
    v = Run(pol)(1.0, reading).verdict
    assert [g.index for g in v.gpus] == [0]


def test_builtin_signal_at_node_scope_names_the_gpus():
    pol = policy(
        {
            "builtin": False,
            "inline": [
                {
                    "name": "t",
                    "signal": "temperature",
                    "threshold": 90,
                    "severity": "degraded",
                    "scope": "node",
                }
            ],
        }
    )
    reading = node(1.0, gpu(0, 1.0), gpu(5, 1.0, temperature_celsius=93.0))
    v = Run(pol)(1.0, reading).verdict
    assert v.whole_node and v.node_findings[0].evidence == "GPU 5: temperature 93 C >= 90 C"
    unknown = node(1.0, gpu(0, 1.0), gpu(5, 1.0, temperature_celsius=None))
    assert Run(pol)(1.0, unknown).verdict.severity is None


def test_selectors_and_pools_limit_where_a_rule_applies():
    pol = policy(
        {
            "builtin": False,
            "inline": [
                {
                    "name": "a",
                    "signal": "gpu_lost",
                    "severity": "unhealthy",
                    "nodeSelector": {"class": "train"},
                },
                {"name": "b", "signal": "gpu_lost", "severity": "degraded", "pools": ["a100"]},
            ],
        }
    )
    reading = node(1.0, gpu(at=1.0, lost=True))
    rules = lambda labels: [f.rule for f in Run(pol, labels)(1.0, reading).verdict.findings]  # noqa: E731
    assert rules({}) == []
    assert rules({"class": "train"}) == ["a"]
    assert rules({"gpumon.io/pool": "a100"}) == ["b"]
    assert rules({"class": "train", "gpumon.io/pool": "a100"}) == ["a", "b"]


def test_rule_removed_from_config_recovers_with_default_hysteresis():
    run = Run(policy(default_recover_after_seconds=50.0))
    run(0.0, node(0.0, gpu(at=0.0, lost=True)))
    run.pol = policy({"builtin": False}, default_recover_after_seconds=50.0)
    assert run(10.0, node(10.0)).verdict.severity is Severity.UNHEALTHY
    assert run(60.0, node(60.0)).verdict.severity is None


def test_restored_state_holds_until_hysteresis_after_restart():
    pol = policy()
    state = restore_state(
        [
            GpuRecord("GPU-3", 3, "XidFatal", Severity.UNHEALTHY, ("xid-unhealthy",), 5.0, "Xid 79"),
            GpuRecord(NODE_TARGET, None, "Custom", Severity.DEGRADED, ("gone",), 5.0, "x"),
        ],
        pol,
    )
    run = Run(pol, state=state)
    ev = run(100.0, node(100.0, gpu(0, 100.0), gpu(3, 100.0)))
    v = ev.verdict
    assert v.severity is Severity.UNHEALTHY and v.recovering
    assert v.gpus[0].findings[0].since == 5.0 and v.gpus[0].findings[0].evidence == "Xid 79"
    assert v.whole_node  # the node finding of a rule that no longer exists, recovering too
    assert run(999.0, node(999.0, gpu(0, 999.0), gpu(3, 999.0))).verdict.severity is Severity.UNHEALTHY
    assert run(1000.0, node(1000.0, gpu(0, 1000.0), gpu(3, 1000.0))).verdict.severity is None


def test_staleness_of_active_nodes_is_watched_too():
    pol = policy(stale_after_seconds=30.0)
    ev = Run(pol)(5.0, node(4.0, gpu(at=4.0, lost=True)))
    assert ev.stale_at == math.nextafter(34.0, math.inf)
    assert Run(pol)(5.0, None).stale_at is None  # no reading: nothing to go stale


def test_each_node_is_judged_on_its_own_reading():
    fleet = FleetSignals({"a": replace(node(1.0, gpu(at=1.0, lost=True)), node="a")})
    pol = policy()
    a = evaluate_node("a", {}, fleet.nodes.get("a"), EMPTY_NODE_STATE, 1.0, pol).verdict
    b = evaluate_node("b", {}, fleet.nodes.get("b"), EMPTY_NODE_STATE, 1.0, pol).verdict
    assert a.severity is Severity.UNHEALTHY and a.node == "a"
    assert b.signals is SignalStatus.MISSING and b.severity is None


def test_for_is_proven_by_data_time_not_by_the_clock():
    run = Run(policy(stale_after_seconds=100.0))
    run(0.0, hot(0.0))
    # The exporter died right after: its last reading never completes the 60 s `for`...
    ev = run(61.0, hot(10.0))
    assert ev.verdict.severity is None
    assert ev.next_check_at == 62.0  # ...and the rule is looked at again shortly
    # ...while a reading taken 60 s after the first bad one does.
    assert run(62.0, hot(60.0)).verdict.severity is Severity.UNHEALTHY


def test_an_xid_leaving_the_window_is_looked_at_again_when_it_leaves():
    # Staleness checks far away, so that the window's end is the next thing due.
    pol = policy(health=HealthPolicy(xid_window_seconds=900.0), stale_after_seconds=10_000.0)
    pending = policy(
        {"builtin": False, "inline": [{"name": "x", "signal": "xid", "severity": "unhealthy", "for": "10m"}]},
        health=HealthPolicy(xid_window_seconds=300.0),
        stale_after_seconds=10_000.0,
    )
    ev = Run(pol)(1000.0, node(1000.0, gpu(at=1000.0, xids=(XidSeen(79, 950.0),))))
    assert ev.verdict.severity is Severity.UNHEALTHY
    # Nothing new arrives, yet the node is looked at again the moment the Xid stops counting.
    assert ev.next_check_at == 950.0 + 900.0
    # A pending `for` longer than the window: the window's end comes first.
    ev = Run(pending)(1000.0, node(1000.0, gpu(at=1000.0, xids=(XidSeen(79, 990.0),))))
    assert ev.next_check_at == 990.0 + 300.0

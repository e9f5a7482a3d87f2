"""Judge GPUs against rules: a pure function of (signals, previous state, now, policy).

Purely computational, no I/O and no clock: the caller passes ``now``.

Per GPU (or per node, for node-scoped rules) and per rule, a small state machine:

- *pending*: the condition holds, but not yet for the rule's ``for``;
- *firing*: it held for ``for``; the GPU counts as degraded or unhealthy;
- *clearing*: firing, but the condition is false; it stops firing once it has stayed false
  for ``recover_after`` (hysteresis), unless the GPU is flapping (fired ``flap_max_onsets``
  times within ``flap_window``), in which case recovery waits until old onsets age out.

A stale or missing reading is *unknown*: it never starts or advances a condition (pending
timers reset), never counts toward recovery (the clearing timer restarts), and never ends a
firing rule: unknown data holds the last verdict and never causes remediation.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpumon.controller.core.contract import LABEL_POOL
from gpumon.controller.core.contract.node import GpuRecord
from gpumon.controller.core.signals import GpuReading, NodeReading
from gpumon.controller.core.verdicts import Finding, GpuVerdict, NodeVerdict, SignalStatus
from gpumon.gpu.health import (
    RECOVERY_REASONS,
    HealthPolicy,
    Op,
    Scope,
    Severity,
    Signal,
    actionable_xids,
    classify_xid,
    default_reason,
    recommended_action,
)

NODE_TARGET = ""
"""Key of the node itself among a node's targets (node-scoped rules)."""


_COMPARE: Mapping[Op, Callable[[float, float], bool]] = MappingProxyType(
    {
        Op.GT: operator.gt,
        Op.GE: operator.ge,
        Op.LT: operator.lt,
        Op.LE: operator.le,
        Op.EQ: operator.eq,
        Op.NE: operator.ne,
    }
)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    signal: Signal
    severity: Severity
    op: Op = Op.GE
    threshold: float = 1.0
    for_seconds: float = 0.0
    recover_after_seconds: float = 900.0
    scope: Scope = Scope.GPU
    reason: str | None = None  # None: from the signal (or the Xid's class)
    action: str | None = None  # None: from the reason
    # xid rules: these codes; None: every code whose class (gpu.health.classify_xid) is this severity.
    xids: frozenset[int] | None = None
    query: str | None = None  # promql rules
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pools: frozenset[str] | None = None

    def holds(self, value: float) -> bool:
        """The rule's condition, on a value of its signal."""
        return _COMPARE[self.op](value, self.threshold)

    def applies_to(self, labels: Mapping[str, str], pool: str) -> bool:
        if self.pools is not None and pool not in self.pools:
            return False
        return all(labels.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[Rule, ...]
    # The one judgement shared with the exporter (gpumon.gpu.health): Xid classes with their per-code
    # overrides, and how long an Xid counts after it was seen (its xid_window_seconds).
    health: HealthPolicy = field(default_factory=HealthPolicy)
    stale_after_seconds: float = 60.0
    flap_window_seconds: float = 3600.0
    flap_max_onsets: int = 3
    pool_label: str = LABEL_POOL
    # Recovery hysteresis for rules restored from a node's annotation whose rule is gone.
    default_recover_after_seconds: float = 900.0
    # How soon to look again at a pending rule whose `for` is due but not yet proven by data.
    recheck_seconds: float = 1.0

    def rule(self, name: str) -> Rule | None:
        for r in self.rules:
            if r.name == name:
                return r
        return None


# ---------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True, slots=True)
class RuleState:
    # Start of the current run of bad observations (the reading's own time): the `for` counts
    # from here, and it is the "first bad signal" of the fault-to-taint latency.
    first_bad_at: float | None = None
    firing_since: float | None = None
    # While firing: the condition has been false (on fresh data) since.
    clear_since: float | None = None
    finding: Finding | None = None

    @property
    def firing(self) -> bool:
        return self.firing_since is not None


_IDLE = RuleState()


@dataclass(frozen=True, slots=True)
class TargetState:
    """One GPU (or the node itself, key :data:`NODE_TARGET`)."""

    index: int
    rules: Mapping[str, RuleState] = field(default_factory=lambda: MappingProxyType({}))
    # Times this target went from no firing rule to some firing rule, within the flap window.
    onsets: tuple[float, ...] = ()

    @property
    def firing(self) -> bool:
        return any(r.firing for r in self.rules.values())

    @property
    def active(self) -> bool:
        """Anything worth remembering: a pending or firing rule, or recent onsets."""
        return bool(self.onsets) or any(r != _IDLE for r in self.rules.values())


@dataclass(frozen=True, slots=True)
class NodeRuleState:
    targets: Mapping[str, TargetState] = field(default_factory=lambda: MappingProxyType({}))
    signals: SignalStatus = SignalStatus.MISSING


EMPTY_NODE_STATE = NodeRuleState()


@dataclass(frozen=True, slots=True)
class NodeEvaluation:
    verdict: NodeVerdict
    state: NodeRuleState
    # When to evaluate again even if no new reading arrives (a `for`, a recovery, an Xid leaving
    # its window).
    next_check_at: float | None
    # When a fresh reading goes stale if no newer one comes: for the shell to compare with the
    # source's latest reading then (see stale_at), which is not an evaluation. A heartbeat
    # renews the reading every few seconds, so evaluating every node again at this time, as
    # before, cost a whole fleet's evaluations a minute for nothing (docs/benchmarks.md).
    stale_at: float | None = None


# ---------------------------------------------------------------------------------------------
# Observations


@dataclass(frozen=True, slots=True)
class _Obs:
    holds: bool | None  # None: unknown
    evidence: str = ""
    reason: str = ""
    observed_at: float = 0.0
    # A condition that holds only until then, by time alone (an Xid leaving the window).
    holds_until: float | None = None


_UNKNOWN = _Obs(None)


def _xid_matches(rule: Rule, code: int, classes: HealthPolicy) -> bool:
    if rule.xids is not None:
        return code in rule.xids
    return classify_xid(code, classes).severity is rule.severity


def _xid_reason(codes: list[int], classes: HealthPolicy) -> str:
    # The reason the exporter's verdict names first for these codes (gpu.health's one order).
    ranked = actionable_xids(codes, classes)
    return ranked[0][1].reason if ranked else default_reason(Signal.XID)


def _numeric(rule: Rule, value: float | None, label: str, unit: str, at: float) -> _Obs:
    if value is None:
        return _UNKNOWN
    if not rule.holds(value):
        return _Obs(False, "", "", at)  # evidence is read only when a condition holds
    return _Obs(True, f"{label} {value:g}{unit} {rule.op} {rule.threshold:g}{unit}", "", at)


def _observe_gpu(rule: Rule, g: GpuReading | None, policy: Policy, now: float) -> _Obs:
    if g is None:
        return _UNKNOWN
    at = g.observed_at
    if rule.signal in g.quiet:
        return _Obs(False, "", "", at)
    match rule.signal:
        case Signal.TEMPERATURE:
            return _numeric(rule, g.temperature_celsius, "temperature", " C", at)
        case Signal.MEMORY_UTILIZATION:
            return _numeric(rule, g.memory_utilization_ratio, "memory utilization", "", at)
        case Signal.ECC_UNCORRECTABLE:
            v = None if g.ecc_uncorrectable is None else float(g.ecc_uncorrectable)
            return _numeric(rule, v, "uncorrectable ECC errors", "", at)
        case Signal.ROW_REMAP_FAILURE:
            if g.row_remap_failure is None:
                return _UNKNOWN
            if not rule.holds(float(g.row_remap_failure)):
                return _Obs(False, "", "", at)
            return _Obs(True, "row remapping failed" if g.row_remap_failure else "row remapping ok", "", at)
        case Signal.GPU_LOST:
            if g.lost is None:
                return _UNKNOWN
            if not rule.holds(float(g.lost)):
                return _Obs(False, "", "", at)
            return _Obs(True, "GPU is lost" if g.lost else "GPU present", "", at)
        case Signal.RECOVERY_ACTION:
            action = g.recovery_action
            if action is None:
                return _UNKNOWN
            if not rule.holds(float(action)):
                return _Obs(False, "", "", at)
            reason = RECOVERY_REASONS.get(action, default_reason(Signal.RECOVERY_ACTION))
            return _Obs(True, f"driver recovery action {action.name}", reason, at)
        case Signal.EXPORTER_HEALTH:
            if g.health is None:
                return _UNKNOWN
            if not rule.holds(float(g.health.state.rank)):
                return _Obs(False, "", "", at)
            detail = f": {g.health.detail}" if g.health.detail else ""
            return _Obs(True, f"exporter verdict {g.health.state}{detail}", g.health.reason, at)
        case Signal.XID:
            if g.xids is None:
                return _UNKNOWN
            # Recent by the controller's own window (not the source's), up to now: a fresh
            # reading that says nothing new does not keep an old Xid recent.
            window = policy.health.xid_window_seconds
            last_seen: dict[int, float] = {}
            for x in g.xids:
                if now - x.at <= window and _xid_matches(rule, x.code, policy.health):
                    last_seen[x.code] = max(x.at, last_seen.get(x.code, x.at))
            if not last_seen:
                return _Obs(False, "", "", at)
            codes = sorted(last_seen)
            evidence = "Xid " + ", ".join(str(c) for c in codes)
            until = max(last_seen.values()) + window
            return _Obs(True, evidence, _xid_reason(codes, policy.health), at, until)
        case Signal.PROMQL:
            # Absent from the query's result while the node is fresh: "not matching" (filter-style
            # queries such as `x > 5` return nothing when all is well).
            value = g.custom.get(rule.name)
            if value is None:
                return _Obs(False, "", "", at)
            return _numeric(rule, value, rule.name, "", at)


def _observe_node(rule: Rule, reading: NodeReading, policy: Policy, now: float) -> _Obs:
    if rule.signal is Signal.PROMQL:
        value = reading.custom.get(rule.name)
        if value is None:
            return _Obs(False, "", "", reading.observed_at)
        return _numeric(rule, value, rule.name, "", reading.observed_at)
    # A per-GPU signal judged for the node: it holds when it holds on any GPU.
    per_gpu = [(g, _observe_gpu(rule, _fresh_gpu(g, reading, policy), policy, now)) for g in reading.gpus]
    bad = [(g, o) for g, o in per_gpu if o.holds]
    if bad:
        evidence = "; ".join(f"GPU {g.index}: {o.evidence}" for g, o in bad)
        untils = [o.holds_until for _, o in bad]
        until = None if None in untils else max(u for u in untils if u is not None)
        return _Obs(True, evidence, bad[0][1].reason, min(o.observed_at for _, o in bad), until)
    if not per_gpu or any(o.holds is None for _, o in per_gpu):
        return _UNKNOWN
    return _Obs(False, "", "", reading.observed_at)


def _fresh_gpu(g: GpuReading, reading: NodeReading, policy: Policy) -> GpuReading | None:
    # A GPU's own reading can lag the node's (e.g. a slow field read timed out).
    return g if reading.observed_at - g.observed_at <= policy.stale_after_seconds else None


# ---------------------------------------------------------------------------------------------
# Stepping


def _step(rule: Rule, st: RuleState, obs: _Obs, now: float, hold_recovery: bool) -> RuleState:
    if obs.holds is None:
        if not st.firing:
            return _IDLE
        return replace(st, clear_since=None)
    if obs.holds:
        first = st.first_bad_at if st.first_bad_at is not None else obs.observed_at
        reason = rule.reason or obs.reason or default_reason(rule.signal)
        if st.firing:
            assert st.finding is not None
            finding = replace(st.finding, evidence=obs.evidence, reason=reason)
            return RuleState(first, st.firing_since, None, finding)
        # The `for` is proven by data, not by the clock: a reading taken at least `for` after
        # the first bad one (a dead exporter's last reading never completes it).
        if obs.observed_at - first >= rule.for_seconds:
            finding = Finding(
                rule=rule.name,
                severity=rule.severity,
                reason=reason,
                evidence=obs.evidence,
                action=rule.action or recommended_action(reason),
                since=now,
                first_bad_at=first,
            )
            return RuleState(first, now, None, finding)
        return RuleState(first_bad_at=first)
    return _clearing(st, now, rule.recover_after_seconds, hold_recovery)


def _clearing(st: RuleState, now: float, recover_after: float, hold_recovery: bool) -> RuleState:
    """The condition is false on fresh data."""
    if not st.firing:
        return _IDLE
    clear = st.clear_since if st.clear_since is not None else now
    if now - clear >= recover_after and not hold_recovery:
        return _IDLE
    return replace(st, clear_since=clear)


def _next_check(
    rule: Rule | None, st: RuleState, recover_after: float, now: float, recheck: float
) -> float | None:
    if st.firing:
        return None if st.clear_since is None else st.clear_since + recover_after
    if st.first_bad_at is not None and rule is not None:
        due = st.first_bad_at + rule.for_seconds
        # Due, but no reading new enough yet: look again shortly.
        return due if due > now else now + recheck
    return None


def _step_target(
    prev: TargetState,
    rules: Iterable[Rule],
    observe: Callable[[Rule], _Obs],
    now: float,
    policy: Policy,
) -> tuple[TargetState, list[float]]:
    observed = [(rule, observe(rule)) for rule in rules]
    if (
        not prev.rules
        and not prev.onsets
        and not any(o.holds or o.holds_until is not None for _, o in observed)
    ):
        # Nothing remembered and nothing holds: what the steps below come to, for most GPUs of
        # a fleet on every look, without them.
        return prev, []
    onsets = tuple(t for t in prev.onsets if now - t < policy.flap_window_seconds)
    flapping = len(onsets) >= policy.flap_max_onsets
    new_rules: dict[str, RuleState] = {}
    wakeups: list[float] = []
    seen: set[str] = set()
    for rule, obs in observed:
        seen.add(rule.name)
        st = _step(rule, prev.rules.get(rule.name, _IDLE), obs, now, flapping)
        if st != _IDLE:
            new_rules[rule.name] = st
        if obs.holds_until is not None:
            wakeups.append(obs.holds_until)
        wake = _next_check(rule, st, rule.recover_after_seconds, now, policy.recheck_seconds)
        if wake is not None:
            wakeups.append(wake)
    # Firing rules that no longer apply (removed from config, node relabelled): their
    # condition is gone, so they recover through the usual hysteresis.
    for name, st in prev.rules.items():
        if name in seen or not st.firing:
            continue
        st = _clearing(st, now, policy.default_recover_after_seconds, flapping)
        if st != _IDLE:
            new_rules[name] = st
            wake = _next_check(None, st, policy.default_recover_after_seconds, now, policy.recheck_seconds)
            if wake is not None:
                wakeups.append(wake)
    state = TargetState(prev.index, MappingProxyType(new_rules), onsets)
    if state.firing and not prev.firing:
        state = replace(state, onsets=(*onsets, now))
    if state.onsets:
        wakeups.append(state.onsets[0] + policy.flap_window_seconds)
    return state, wakeups


def _findings(state: TargetState) -> tuple[Finding, ...]:
    found = [r.finding for r in state.rules.values() if r.firing and r.finding is not None]
    return tuple(sorted(found, key=lambda f: (-f.severity.rank, f.rule)))


def _recovering(state: TargetState) -> bool:
    firing = [r for r in state.rules.values() if r.firing]
    return bool(firing) and all(r.clear_since is not None for r in firing)


def stale_at(reading: NodeReading, policy: Policy) -> float:
    """The first time at which ``reading`` counts as stale (older than ``stale_after``, as
    :func:`signal_status` says), unless a newer one replaces it."""
    return math.nextafter(reading.observed_at + policy.stale_after_seconds, math.inf)


def signal_status(
    reading: NodeReading | None, now: float, policy: Policy
) -> tuple[SignalStatus, float | None]:
    if reading is None:
        return SignalStatus.MISSING, None
    age = max(0.0, now - reading.observed_at)
    return (SignalStatus.STALE if age > policy.stale_after_seconds else SignalStatus.FRESH), age


def waits_for_gpus(
    reading: NodeReading, previous: NodeRuleState, quarantined: bool, now: float, policy: Policy
) -> bool:
    """Whether a node gpumon holds state on (findings, pending rules, a quarantine) waits for a
    reading GPU by GPU before it is decided: on a fresh summary (a source read it as a whole)
    its GPUs read unknown and its pods unplaced, and a partial drain would evict every GPU pod.
    A stale summary decides as any stale reading does."""
    return (
        not reading.gpus_read
        and (bool(previous.targets) or quarantined)
        and signal_status(reading, now, policy)[0] is SignalStatus.FRESH
    )


def evaluate_node(
    node: str,
    labels: Mapping[str, str],
    reading: NodeReading | None,
    previous: NodeRuleState,
    now: float,
    policy: Policy,
) -> NodeEvaluation:
    status, age = signal_status(reading, now, policy)
    fresh = reading if status is SignalStatus.FRESH else None
    pool = labels.get(policy.pool_label, "")
    rules = [r for r in policy.rules if r.applies_to(labels, pool)]
    gpu_rules = [r for r in rules if r.scope is Scope.GPU]
    node_rules = [r for r in rules if r.scope is Scope.NODE]

    readings = {g.uuid: g for g in fresh.gpus} if fresh is not None else {}
    targets: dict[str, TargetState] = {}
    wakeups: list[float] = []
    gpu_verdicts: list[GpuVerdict] = []

    # GPUs in this reading plus GPUs remembered from before: a GPU that vanished from the
    # exporter's list is unknown, never "recovered".
    for uuid in sorted(set(readings) | (set(previous.targets) - {NODE_TARGET})):
        g = readings.get(uuid)
        prev = previous.targets.get(uuid) or TargetState(index=g.index if g is not None else -1)
        if g is not None and prev.index != g.index:
            prev = replace(prev, index=g.index)
        g_fresh = _fresh_gpu(g, fresh, policy) if g is not None and fresh is not None else None
        observe = functools.partial(_observe_gpu, g=g_fresh, policy=policy, now=now)
        state, wakes = _step_target(prev, gpu_rules, observe, now, policy)
        if state.active:
            targets[uuid] = state
            wakeups += wakes
        if state.firing:
            gpu_verdicts.append(
                GpuVerdict(
                    uuid=uuid,
                    index=state.index,
                    findings=_findings(state),
                    recovering=_recovering(state),
                    flapping=len(state.onsets) >= policy.flap_max_onsets,
                )
            )

    prev_node = previous.targets.get(NODE_TARGET) or TargetState(index=-1)
    node_state, wakes = _step_target(
        prev_node,
        node_rules,
        lambda r: _observe_node(r, fresh, policy, now) if fresh is not None else _UNKNOWN,
        now,
        policy,
    )
    if node_state.active:
        targets[NODE_TARGET] = node_state
        wakeups += wakes

    verdict = NodeVerdict(
        node=node,
        signals=status,
        age_seconds=age,
        gpus=tuple(gpu_verdicts),
        node_findings=_findings(node_state),
        node_recovering=_recovering(node_state),
    )
    future = [w for w in wakeups if w > now]
    return NodeEvaluation(
        verdict=verdict,
        state=NodeRuleState(MappingProxyType(targets), status),
        next_check_at=min(future) if future else None,
        # Going stale must be noticed even if nothing else happens.
        stale_at=stale_at(fresh, policy) if fresh is not None else None,
    )


# ---------------------------------------------------------------------------------------------
# Restoring state after a restart or a leader change


def restore_state(records: Iterable[GpuRecord], policy: Policy) -> NodeRuleState:
    """A node's state rebuilt from what gpumon wrote on it: its rules keep firing (since their
    first-seen time), so recovery still waits out the full hysteresis after a restart."""
    targets: dict[str, TargetState] = {}
    for g in records:
        rules: dict[str, RuleState] = {}
        for name in g.rules:
            rule = policy.rule(name)
            severity = rule.severity if rule is not None else g.severity
            reason = (rule.reason if rule is not None else None) or g.reason
            finding = Finding(
                rule=name,
                severity=severity,
                reason=reason,
                evidence=g.evidence,
                action=(rule.action if rule is not None else None) or recommended_action(reason),
                since=g.first_seen,
                first_bad_at=g.first_seen,
            )
            rules[name] = RuleState(g.first_seen, g.first_seen, None, finding)
        if rules:
            index = -1 if g.index is None else g.index
            targets[g.uuid or NODE_TARGET] = TargetState(index, MappingProxyType(rules))
    return NodeRuleState(MappingProxyType(targets), SignalStatus.MISSING)


def with_records(state: NodeRuleState, records: Iterable[GpuRecord], policy: Policy) -> NodeRuleState:
    """``state`` plus whatever gpumon recorded on the node that it does not already hold as
    firing (after a restart, or on a replica that just became leader), so that recovery always
    waits out its hysteresis from this replica's own observations."""
    restored = restore_state(records, policy)
    held = {k for k, t in state.targets.items() if t.firing}
    missing = {k: t for k, t in restored.targets.items() if k not in held}
    if not missing:
        return state
    return NodeRuleState(MappingProxyType({**state.targets, **missing}), state.signals)

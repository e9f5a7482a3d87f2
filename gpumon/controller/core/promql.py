"""The PromQL of one Prometheus round, built from the rules (pure).

Answers follow what is wrong, not the size of the fleet. A round asks in two steps.

First, of the whole fleet: one sample per node (``NODES``: the time of its last scrape; where
pools are autoscaled, ``BUSY``: whether the exporter places any pod on its GPUs, which the
autoscaler reads instead of listing an idle-looking node's pods), and per built-in signal only
the GPUs on which some rule's condition holds (``gpumon_gpu_temperature_celsius > 87``). A
one-hot signal is asked by its one left-out series (``{action="none"} != 1``): a series a GPU
instead of one per value (at 65,000 nodes its fleet-wide ``== 1`` was the round's slowest
query, 15.2 s).

Then, GPU by GPU, only of the nodes of interest: those the first answers named, and those the
reconciler holds state on (which only it knows). For them it asks which GPUs each has, with the
time of their last scrape (``FRESHNESS``: a GPU the controller holds as unhealthy must be seen
present to recover, and one gone from the exporter's list must read unknown), which pods each
GPU holds (``PODS``: a partial drain places pods by GPU), the one-hot values, and which GPUs lack
each signal's series (normally none). A GPU of such a node in no answer has the series and no
rule holds for it: the policy judges it exactly as it judged the value itself, "does not hold",
while a GPU without the series stays unknown (a lost GPU's temperature must hold a firing thermal
rule, not let it recover). Hysteresis is by time (``recoverAfter`` on fresh data that does not
hold), not by a second threshold, so the rules' own conditions are the whole filter: the
loosest of them per signal.

Every other node is read as a whole: fresh or not, busy or not, nothing wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gpumon.controller.core.policy import Rule
from gpumon.gpu.health import Op, Signal
from gpumon.gpu.model import HealthState, RecoveryAction

NODES = "__nodes"
BUSY = "__busy"
FRESHNESS = "__freshness"
PODS = "__pods"
HEALTH_INFO = "__health_info"
MISSING = "missing:"
"""Prefix of the query naming the GPUs that lack a signal's series."""
FLAG = "flag:"
"""Prefix of the fleet-wide query naming the GPUs whose one-hot value is not the left-out one."""

POD_SERIES = (
    "gpumon_pod_gpu_(allocated|memory_used_bytes|utilization_ratio|"
    "memory_allocated_bytes|core_allocated_ratio)"
)


@dataclass(frozen=True, slots=True)
class OneHot:
    """A signal exported one-hot: a series per value, named by ``label``, 1 on the current one."""

    label: str
    values: Mapping[str, float]  # label value -> the number rules compare, in the enum's order


@dataclass(frozen=True, slots=True)
class Series:
    """Where a built-in signal's value per GPU comes from."""

    selector: str
    boolean: bool = False
    one_hot: OneHot | None = None


SERIES: Mapping[Signal, Series] = MappingProxyType(
    {
        Signal.TEMPERATURE: Series('gpumon_gpu_temperature_celsius{sensor="gpu"}'),
        Signal.MEMORY_UTILIZATION: Series("gpumon_gpu_memory_utilization_ratio"),
        Signal.ECC_UNCORRECTABLE: Series('gpumon_gpu_ecc_errors_total{type="uncorrected"}'),
        Signal.ROW_REMAP_FAILURE: Series("gpumon_gpu_row_remap_failure", boolean=True),
        Signal.GPU_LOST: Series('gpumon_gpu_health{state="lost"}', boolean=True),
        Signal.RECOVERY_ACTION: Series(
            "gpumon_gpu_recovery_action",
            one_hot=OneHot("action", MappingProxyType({a.label: float(a) for a in RecoveryAction})),
        ),
        Signal.EXPORTER_HEALTH: Series(
            "gpumon_gpu_health",
            one_hot=OneHot("state", MappingProxyType({s.value: float(s.rank) for s in HealthState})),
        ),
    }
)


def left_out(signal: Signal, rules: Sequence[Rule]) -> float | str | None:
    """The value of a boolean or one-hot signal that its answer leaves out because no rule on it
    holds for it (the first such: false, NONE, healthy), so that a GPU absent from the answer
    still reads that exact value; None where every value makes some rule hold, or for a numeric
    signal (whose GPUs absent from the answer read "quiet")."""
    series = SERIES[signal]
    on = [r for r in rules if r.signal is signal]
    candidates: Mapping[str, float] | Mapping[float, float]
    if series.one_hot is not None:
        candidates = series.one_hot.values
    elif series.boolean:
        candidates = {0.0: 0.0, 1.0: 1.0}
    else:
        return None
    return next((key for key, number in candidates.items() if not any(r.holds(number) for r in on)), None)


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def conditions(rules: Sequence[Rule]) -> list[str]:
    """The rules' comparisons, the loosest one per direction (``> 87`` and ``>= 95`` ask
    ``> 87``), equalities each: a value some rule holds for satisfies at least one."""
    out: list[str] = []
    above = [(r.threshold, r.op is Op.GT) for r in rules if r.op in (Op.GT, Op.GE)]
    if above:
        threshold, strict = min(above)
        out.append(f"{'>' if strict else '>='} {_number(threshold)}")
    below = [(r.threshold, r.op is Op.LE) for r in rules if r.op in (Op.LT, Op.LE)]
    if below:
        threshold, inclusive = max(below)
        out.append(f"{'<=' if inclusive else '<'} {_number(threshold)}")
    for op in (Op.EQ, Op.NE):
        out += [f"{op} {_number(t)}" for t in sorted({r.threshold for r in rules if r.op is op})]
    return out


def _with(selector: str, matcher: str | None) -> str:
    if matcher is None:
        return selector
    return selector[:-1] + f",{matcher}}}" if selector.endswith("}") else selector + f"{{{matcher}}}"


def bad_query(signal: Signal, rules: Sequence[Rule], matcher: str | None = None) -> str:
    """The GPUs on which some rule on ``signal`` could hold, with their values (of the nodes
    ``matcher`` selects, or of all)."""
    series = SERIES[signal]
    on = [r for r in rules if r.signal is signal]
    skip = left_out(signal, on)
    selector = _with(series.selector, matcher)
    if series.one_hot is not None:
        if skip is None:
            return f"{selector} == 1"
        other = f'{series.one_hot.label}!="{skip}"'
        return f"{_with(selector, other)} == 1"
    if series.boolean:
        return selector if skip is None else f"{selector} != {_number(float(skip))}"
    return " or ".join(f"({selector} {c})" for c in conditions(on))


def flag_query(signal: Signal, rules: Sequence[Rule]) -> str | None:
    """For a one-hot signal with a left-out value: the GPUs whose value is another, read from
    the left-out value's series alone (one a GPU, not one per value); None for any other."""
    series = SERIES[signal]
    skip = left_out(signal, [r for r in rules if r.signal is signal])
    if series.one_hot is None or skip is None:
        return None
    left = f'{series.one_hot.label}="{skip}"'
    return f"{_with(series.selector, left)} != 1"


def missing_query(signal: Signal, rules: Sequence[Rule], node_label: str, matcher: str | None = None) -> str:
    """The GPUs that have no value of ``signal`` (normally none; every GPU where the GPUs or the
    driver do not support the field: a join per node instead costs the server twice as much)."""
    series = SERIES[signal]
    present = _with(series.selector, matcher)
    if series.one_hot is not None:
        skip = left_out(signal, rules)
        # The exporter writes a one-hot whole or not at all, so the left-out value's series says
        # the GPU has a value, as cheaply as any (`== 1` over all of them costs the server more).
        present = f"({present} == 1)" if skip is None else _with(present, f'{series.one_hot.label}="{skip}"')
    info = _with("gpumon_gpu_info", matcher)
    return f"group by ({node_label}, uuid) ({info}) unless on ({node_label}, uuid) {present}"


def xid_query(xid_window_seconds: float) -> str:
    # increase() misses a counter's first sample, and the exporter creates an Xid series only
    # when the code is first seen: count series that did not exist a window ago as well.
    window = f"{int(xid_window_seconds)}s"
    return (
        f"(increase(gpumon_gpu_xid_errors_total[{window}]) > 0) or "
        f"(gpumon_gpu_xid_errors_total unless gpumon_gpu_xid_errors_total offset {window})"
    )


def _signals(rules: Sequence[Rule], verdicts: bool) -> list[Signal]:
    asked = {r.signal for r in rules} | ({Signal.EXPORTER_HEALTH} if verdicts else set())
    return sorted(asked & SERIES.keys())


def queries_for(
    rules: Sequence[Rule],
    xid_window_seconds: float,
    node_label: str = "node",
    *,
    verdicts: bool = False,
    busy: bool = False,
) -> dict[str, str]:
    """Query name -> PromQL asked of the whole fleet each round (the first step). ``verdicts``:
    also the exporter's verdict of every GPU, which the repair ladder confirms a repaired GPU
    by, whether or not a rule reads it; asked, like any signal, as the GPUs judged worse than
    healthy (a GPU absent reads healthy). ``busy``: also which nodes run pods on their GPUs,
    which only the autoscaler reads (a sample a node, and the round's slowest query at 65,000
    nodes: 8.8 s of Prometheus's time, over every pod series)."""
    n = node_label
    out: dict[str, str] = {NODES: f"max by ({n}) (timestamp(gpumon_gpu_info))"}
    if busy:
        out[BUSY] = f'group by ({n}) ({{__name__=~"{POD_SERIES}"}})'
    for sig in _signals(rules, verdicts):
        flag = flag_query(sig, rules)
        if flag is None:
            out[sig.value] = bad_query(sig, rules)
        else:
            out[FLAG + sig.value] = flag
    if Signal.XID in {r.signal for r in rules}:
        out[Signal.XID.value] = xid_query(xid_window_seconds)
    if Signal.EXPORTER_HEALTH in {r.signal for r in rules} or verdicts:
        out[HEALTH_INFO] = 'gpumon_gpu_health_info{reason!=""}'
    for r in rules:
        if r.signal is Signal.PROMQL and r.query is not None:
            out[f"rule:{r.name}"] = r.query
    return out


def node_matcher(nodes: Sequence[str], node_label: str = "node") -> str:
    """A label matcher selecting exactly ``nodes``, which must be Kubernetes node names (DNS
    subdomains: ``[a-z0-9.-]``, of which only the dot means something in a regular expression;
    a PromQL string doubles the backslash that escapes it). Prometheus looks an alternation of
    up to 256 literals up as a set (the source's chunks keep to that)."""
    names = "|".join(name.replace(".", "\\\\.") for name in nodes)
    return f'{node_label}=~"{names}"'


def detail_queries(
    rules: Sequence[Rule], nodes: Sequence[str], node_label: str = "node", *, verdicts: bool = False
) -> dict[str, str]:
    """Query name -> PromQL reading ``nodes`` GPU by GPU (the second step): their GPUs and when
    each was scraped, the pods on each, the one-hot values, and the GPUs lacking a series."""
    n = node_label
    m = node_matcher(nodes, n)
    out: dict[str, str] = {
        FRESHNESS: f"max by ({n}, gpu, uuid) (timestamp(gpumon_gpu_info{{{m}}}))",
        PODS: f'group by ({n}, namespace, pod, container, gpu, uuid) ({{__name__=~"{POD_SERIES}",{m}}})',
    }
    for sig in _signals(rules, verdicts):
        if flag_query(sig, rules) is not None:
            out[sig.value] = bad_query(sig, rules, m)
        out[MISSING + sig.value] = missing_query(sig, rules, n, m)
    return out

"""The controller's scale curve (pure): the figures measured at each fleet size, a least-squares
line through each, what the lines say about a larger fleet, and the tables of RESULTS.md.

Every fleet of the curve has the same shape (``GPUS_PER_NODE`` GPUs and ``PODS_PER_NODE`` pods a
node), so nodes and pods grow together and one fleet-size variable explains both: a figure is
fitted as ``y = a + b * nodes``, and its cost per pod is ``b / PODS_PER_NODE`` only under that
shape. What a node and a pod each cost in the cache is measured apart (bench/cache_bytes.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench import fleet_churn
from bench.cache_bytes import CacheSize
from bench.report import Grid
from bench.scale_fleet import CPU_PODS_PER_NODE, GPUS_PER_NODE

PODS_PER_NODE = GPUS_PER_NODE + CPU_PODS_PER_NODE
GOAL_NODES = 10_000
LARGEST_CLUSTERS = 65_000  # nodes in the largest managed clusters
MIB = float(1 << 20)


@dataclass(frozen=True, slots=True)
class Point:
    """The figures of one fleet size; times in seconds, NaN when not measured."""

    nodes: int
    cpu_cores: float  # steady, the controller's utime + stime over the window
    rss_bytes: float
    requests_per_second: float  # the API requests the controller makes, steady
    fault_to_taint: float  # median of the trials
    taint_to_eviction: float  # worst of the trials
    pending_to_request: float  # worst pending pod
    restart_synced: float  # process started again -> every informer synced
    restart_decision: float  # process started again -> a fault injected while it was down tainted
    load: float  # the 1-minute load average at the end of the steady window
    # The leader killed, a standby replica (synced) takes over -> a fault injected at the kill
    # tainted; NaN where two replicas' watch streams do not fit.
    leader_change_decision: float = math.nan

    @property
    def pods(self) -> int:
        return self.nodes * PODS_PER_NODE


def _seconds(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _cores(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _mib(value: float) -> str:
    return "—" if math.isnan(value) else f"{value / MIB:,.0f} MiB"


def _rate(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}/s"


@dataclass(frozen=True, slots=True)
class Figure:
    label: str
    value: Callable[[Point], float]
    text: Callable[[float], str]
    goal: float | None = None  # at GOAL_NODES, lower is better
    goal_text: str = "—"


FIGURES: tuple[Figure, ...] = (
    Figure("steady CPU (cores)", lambda p: p.cpu_cores, _cores, 0.1, "≤ 0.1 core"),
    Figure("RSS", lambda p: p.rss_bytes, _mib, 400 * MIB, "≤ 400 MiB"),
    Figure("API requests/s", lambda p: p.requests_per_second, _rate),
    Figure("fault → taint (median)", lambda p: p.fault_to_taint, _seconds, 2.0, "≤ 2 s"),
    Figure("taint → first eviction (worst)", lambda p: p.taint_to_eviction, _seconds),
    Figure("pending pod → scale request (worst)", lambda p: p.pending_to_request, _seconds),
    Figure("restart → informers synced", lambda p: p.restart_synced, _seconds),
    Figure("restart → first correct decision", lambda p: p.restart_decision, _seconds, 15.0, "≤ 15 s"),
    Figure("leader change → first correct decision", lambda p: p.leader_change_decision, _seconds),
)


@dataclass(frozen=True, slots=True)
class Fit:
    """``y = intercept + slope * nodes``, by ordinary least squares over the sizes that ran."""

    intercept: float
    slope: float  # per node
    sizes: tuple[int, ...]
    residuals: tuple[float, ...]  # measured - fitted, at each size

    def at(self, nodes: float) -> float:
        return self.intercept + self.slope * nodes

    @property
    def per_pod(self) -> float:
        return self.slope / PODS_PER_NODE

    def crossing(self, limit: float) -> float:
        """The fleet size (nodes) at which the line reaches ``limit``; inf if it never does,
        0 if it is there already with no nodes."""
        if self.intercept >= limit:
            return 0.0
        return (limit - self.intercept) / self.slope if self.slope > 0 else math.inf


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> Fit | None:
    """The line through the finite (x, y) pairs; None with fewer than two distinct sizes."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if len({x for x, _ in pairs}) < 2:
        return None
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    slope = sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)
    intercept = my - slope * mx
    return Fit(
        intercept,
        slope,
        tuple(int(x) for x, _ in pairs),
        tuple(y - (intercept + slope * x) for x, y in pairs),
    )


def fits(points: Sequence[Point]) -> dict[str, Fit | None]:
    xs = [float(p.nodes) for p in points]
    return {f.label: least_squares(xs, [f.value(p) for p in points]) for f in FIGURES}


def first_to_run_out(points: Sequence[Point]) -> tuple[str, float] | None:
    """Of the figures with a goal, the one whose line crosses its goal at the fewest nodes, and
    that size."""
    crossings = [
        (f.label, fit.crossing(f.goal))
        for f, fit in zip(FIGURES, fits(points).values(), strict=True)
        if f.goal is not None and fit is not None
    ]
    return min(crossings, key=lambda c: c[1], default=None)


# ---------------------------------------------------------------------------------------------
# Tables


def curve_grid(points: Sequence[Point], churns: Mapping[int, fleet_churn.Churn]) -> Grid:
    """``churns``: the churn phase by fleet size, where one ran (not a fitted figure: a count
    whose goal is none)."""
    header = (
        "nodes",
        "GPUs",
        "pods",
        *(f.label for f in FIGURES),
        fleet_churn.losses_header(churns.values()),
        "load (1 min)",
    )
    rows = [
        (
            f"{p.nodes:,}",
            f"{p.nodes * GPUS_PER_NODE:,}",
            f"{p.pods:,}",
            *(f.text(f.value(p)) for f in FIGURES),
            fleet_churn.losses_cell(churns.get(p.nodes)),
            f"{p.load:.2f}",
        )
        for p in sorted(points, key=lambda p: p.nodes)
    ]
    goals = (f"goal at {GOAL_NODES:,}", "", "", *(f.goal_text for f in FIGURES), fleet_churn.GOAL_TEXT, "")
    at_goal = next((p for p in points if p.nodes == GOAL_NODES), None)
    met: list[tuple[str, ...]] = []
    if at_goal is not None:
        met = [
            (
                f"met at {GOAL_NODES:,}",
                "",
                "",
                *(_met(f.value(at_goal), f.goal) for f in FIGURES),
                fleet_churn.losses_met(churns.get(GOAL_NODES)),
                "",
            )
        ]
    return Grid(
        "Controller scale curve",
        "One row per fleet size, each in a fresh control plane; the method is in the notes below.",
        header,
        (*rows, goals, *met),
    )


def _met(value: float, goal: float | None) -> str:
    if goal is None:
        return ""
    if math.isnan(value):
        return "not measured"
    return "yes" if value <= goal else "**no**"


def _signed(text: Callable[[float], str], value: float) -> str:
    return ("−" if value < 0 else "+") + text(abs(value))


def fit_grid(points: Sequence[Point]) -> Grid:
    header = (
        "figure",
        "a (intercept)",
        "b (per node)",
        f"per pod (b / {PODS_PER_NODE})",
        "residuals (measured − fitted), by size",
        f"at {LARGEST_CLUSTERS:,} nodes",
        "goal (at 10,000)",
        "line reaches the goal at",
    )
    rows = []
    for f, fit in zip(FIGURES, fits(points).values(), strict=True):
        if fit is None:
            rows.append((f.label, "—", "—", "—", "fewer than 2 sizes", "—", f.goal_text, "—"))
            continue
        residuals = ", ".join(
            f"{n:,}: {_signed(f.text, r)}" for n, r in zip(fit.sizes, fit.residuals, strict=True)
        )
        crossing = "—" if f.goal is None else _nodes(fit.crossing(f.goal))
        rows.append(
            (
                f.label,
                f.text(fit.intercept) if fit.intercept >= 0 else _signed(f.text, fit.intercept),
                _per(f.text, fit.slope),
                _per(f.text, fit.per_pod),
                residuals,
                _predicted(f.text, fit.at(LARGEST_CLUSTERS)),
                f.goal_text,
                crossing,
            )
        )
    return Grid(
        "Controller scale curve: growth fitted",
        f"Each figure fitted as y = a + b × nodes by ordinary least squares over the sizes that ran "
        f"({', '.join(f'{p.nodes:,}' for p in sorted(points, key=lambda p: p.nodes))}); pods grow with "
        f"nodes ({PODS_PER_NODE} a node), so the per-pod figure is b / {PODS_PER_NODE} under this "
        "fleet's shape, not a separate fit. With two sizes the residuals are zero by construction.",
        header,
        tuple(rows),
    )


def _predicted(text: Callable[[float], str], value: float) -> str:
    # A falling line (noise over sizes that cost the same) says nothing below zero.
    return text(value) if value >= 0 else "below 0: the line falls"


def _per(text: Callable[[float], str], value: float) -> str:
    """A per-node or per-pod figure: scaled to 1,000 so that small slopes keep their digits."""
    return _signed(text, value * 1000) + " per 1,000"


def _nodes(n: float) -> str:
    return "never (flat or falling)" if math.isinf(n) else f"{n:,.0f} nodes"


def cache_grid(samples: Sequence[CacheSize], nodes: int) -> Grid:
    header = (
        "objects",
        "listed",
        "kept in the cache",
        "slim view, bytes each",
        "full object, bytes each",
        "ratio",
    )
    rows = tuple(
        (
            s.kind,
            f"{s.listed:,}",
            f"{s.kept:,}",
            f"{s.view_per_object:,.0f}",
            f"{s.full_per_object:,.0f}",
            f"{s.ratio:.1f}× less (all {s.listed:,} listed)",
        )
        for s in samples
    )
    return Grid(
        f"Controller scale curve: informer cache bytes (sampled at {nodes:,} nodes)",
        "Objects listed from the bench's API server during the run, as it returns them (managedFields "
        "included); deep size (`sys.getsizeof` over everything reachable, each object once) of the "
        "controller's views (gpumon/controller/core/objects.py) beside the decoded full objects an "
        "informer keeping whole objects would hold. Pods are not cached since the fleet-wide Pod cache "
        "was removed (issue #29): a node's pods are listed when a decision needs them. Exporter streams: "
        "the same nodes' watch state lines as the signal farm serves them, a GPU each as the direct "
        "source keeps it (gpumon/controller/shell/signal_sources/direct.py) beside the parsed wire "
        "model it kept before issue #29.",
        header,
        rows,
    )

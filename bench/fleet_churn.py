"""The fleet churning under the controller in the scale curve (pure): which pods are replaced and
which nodes leave and join when, how lease losses are counted, the figures and their table.

Issue #29 asks for no lease loss over 30 minutes at 10,000 nodes "while the fleet churns (pods
created and deleted, nodes joining and leaving)". The churn runs at steady rates stated up front
(:class:`Rates`), spread over the fleet:

- *pods*: a running bench pod deleted and a replacement (another name, the same node, the same
  kind) created, ``pods_per_second`` times a second, GPU and CPU pods 8 to 2 over any 10
  replacements, as the fleet has them; no pod is replaced twice before every other was once.
- *nodes*: every ``node_seconds`` one node leaves (its pods deleted, then the Node) and the node
  that left ``away_steps`` steps earlier joins again (the Node created, its 10 pods bound to it).
  A joining node keeps its name, so the signal farm and the controller's static endpoint map
  already serve its exporter: it joins with fresh signals, as a node whose exporter DaemonSet pod
  starts with it does. The nodes that leave are set apart from those whose pods are replaced,
  and the nodes the trials gave a fault are spared both.

Lease losses are counted twice: ``leadership lost`` lines in the controller's log (every loss,
however short) and 1 → 0 transitions of its ``gpumon_controller_leader`` gauge polled once a
second (a cross-check that does not depend on the log).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import Grid
from bench.scale_fleet import CPU_PODS_PER_NODE, GPUS_PER_NODE, bound_pods

GOAL_MINUTES = 30  # issue #29: no lease loss over a 30-minute run
GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True, slots=True)
class Rates:
    pods_per_second: float = 2.0  # replacements: one pod deleted and one created each
    node_seconds: float = 10.0  # one node leaves and one joins this often; 0: no node churn
    away_steps: int = 3  # a node joins again this many node steps after it left


@dataclass(frozen=True, slots=True)
class PodStep:
    at: float  # seconds into the phase
    node: str
    slot: int  # the index of the pod in bound_pods(node): GPU pods first, then CPU pods
    delete: str
    create: str


@dataclass(frozen=True, slots=True)
class NodeStep:
    at: float
    leaves: str
    joins: str | None  # the node that left away_steps steps earlier


@dataclass(frozen=True, slots=True)
class Schedule:
    pods: tuple[PodStep, ...]
    nodes: tuple[NodeStep, ...]


def spread(count: int) -> list[int]:
    """0 … count - 1 in an order that jumps across the fleet (consecutive picks about 0.62 ×
    count apart, each once), so churn never dwells on one stretch of node names."""
    stride = max(1, round(count * GOLDEN))
    while math.gcd(stride, count) != 1:
        stride += 1
    return [(i * stride) % count for i in range(count)]


def _pod_name(node: str, slot: int, generation: int) -> str:
    base = str(bound_pods(node)[slot]["metadata"]["name"])
    return base if generation == 0 else f"{base}-r{generation}"


def schedule(names: Sequence[str], spared: Iterable[str], seconds: float, rates: Rates) -> Schedule:
    """The phase's steps: pods replaced at ``rates.pods_per_second`` and nodes leaving and
    joining every ``rates.node_seconds``, on the fleet ``names`` less ``spared``."""
    keep = set(spared)
    candidates = [n for n in names if n not in keep]
    ordered = [candidates[i] for i in spread(len(candidates))]
    node_steps = int(seconds // rates.node_seconds) if rates.node_seconds > 0 else 0
    # At most half the fleet leaves: the other half keeps the pod churn.
    leavers = ordered[: min(node_steps, len(ordered) // 2)]
    if node_steps > len(leavers) and len(leavers) <= rates.away_steps:
        raise ValueError(f"{len(names)} nodes are too few to churn nodes for {seconds:g} s")
    nodes = tuple(
        NodeStep(
            i * rates.node_seconds,
            leavers[i % len(leavers)],
            leavers[(i - rates.away_steps) % len(leavers)] if i >= rates.away_steps else None,
        )
        for i in range(node_steps)
    )
    stay = ordered[len(leavers) :]
    per_node = GPUS_PER_NODE + CPU_PODS_PER_NODE
    slots = len(stay) * per_node
    pods = []
    for k in range(int(seconds * rates.pods_per_second) if slots else 0):
        generation, j = divmod(k, slots)
        # Consecutive steps take the next slot, each on another node, so any per_node steps in a
        # row replace each of a node's pods once: the fleet's proportion of GPU to CPU pods. For
        # each slot, ``turn`` runs over every node once per generation.
        turn, slot = divmod(j, per_node)
        node = stay[(turn + slot * max(1, len(stay) // per_node)) % len(stay)]
        at = k / rates.pods_per_second
        pods.append(
            PodStep(at, node, slot, _pod_name(node, slot, generation), _pod_name(node, slot, generation + 1))
        )
    return Schedule(tuple(pods), nodes)


def replacement(step: PodStep) -> dict[str, Any]:
    """The pod a step creates: the one it deletes, named anew, bound to the same node."""
    pod = bound_pods(step.node)[step.slot]
    return {**pod, "metadata": {**pod["metadata"], "name": step.create}}


# ---------------------------------------------------------------------------------------------
# Counting lease losses


def leader_drops(samples: Iterable[float | None]) -> int:
    """1 → 0 transitions of the leader gauge over polls in order; an unanswered poll (None) is
    skipped, so a loss seen across unanswered polls counts once."""
    drops, last = 0, None
    for value in samples:
        if value is None:
            continue
        drops += last is not None and last >= 1 > value
        last = value
    return drops


@dataclass(frozen=True, slots=True)
class LeaseLog:
    lost: int
    acquired: int
    slow_rounds: int  # held the lease without acting: a round slower than the renew deadline
    failed_rounds: int


def lease_log(lines: Iterable[str]) -> LeaseLog:
    """What the controller's log lines say about its lease (text or JSON log format alike)."""
    lost = acquired = slow = failed = 0
    for line in lines:
        lost += "leadership lost" in line
        acquired += "leadership acquired" in line
        slow += "lease round slower than the renew deadline" in line
        failed += "lease round failed" in line
    return LeaseLog(lost, acquired, slow, failed)


# ---------------------------------------------------------------------------------------------
# Figures and tables


@dataclass(frozen=True, slots=True)
class Churn:
    """The churn phase of one fleet size as it ran; kept in bench/controller-scale-curve.json."""

    seconds: float
    pods_per_second: float  # the rates asked for
    node_seconds: float
    away_steps: int
    replica: str  # the identity of the replica measured: it held the lease when the phase began
    lease_lost: int  # its log's "leadership lost" lines during the phase
    leader_drops: int  # 1 → 0 transitions of its gauge, polled once a second
    polls: int
    unanswered: int  # polls of its /metrics not answered within the poll's bound
    slowest_poll: float  # seconds, of the answered ones
    slow_rounds: int
    failed_rounds: int
    cpu_cores: float
    rss_bytes: float  # the most sampled during the phase
    requests_per_second: float
    apiserver_cores: float
    load: float  # 1-minute load average at the end
    pod_lists: dict[str, float]  # "reader/result" -> lists of one node's pods during the phase
    pods_deleted: int  # replaced: deleted …
    pods_created: int  # … and their replacements created
    node_pods_deleted: int  # with the nodes that left …
    node_pods_created: int  # … and those that joined
    nodes_left: int
    nodes_joined: int
    behind: float  # the most seconds a step ran after its time: the bench's own lag

    @property
    def lease_losses(self) -> int:
        return max(self.lease_lost, self.leader_drops)

    @property
    def minutes(self) -> float:
        return self.seconds / 60


def _minutes(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def losses_header(churns: Iterable[Churn]) -> str:
    lengths = sorted({_minutes(c.minutes) for c in churns})
    return f"lease losses (churn, {', '.join(lengths)} min)" if lengths else "lease losses (churn)"


def losses_cell(churn: Churn | None) -> str:
    if churn is None:
        return "—"
    return f"{churn.lease_losses}"


def losses_met(churn: Churn | None) -> str:
    """Issue #29's goal: none over 30 minutes."""
    if churn is None:
        return "not measured"
    if churn.lease_losses:
        return "**no**"
    if churn.minutes < GOAL_MINUTES:
        return f"none in {_minutes(churn.minutes)} min, short of {GOAL_MINUTES}"
    return "yes"


GOAL_TEXT = f"0 in {GOAL_MINUTES} min"

CHURN_HEADER = (
    "nodes",
    "churn ran",
    "pods replaced (deleted, created)",
    "nodes left, joined (their pods deleted, created)",
    "lease losses: log, gauge 1 → 0",
    "/metrics polls unanswered (slowest answer)",
    "lease rounds slow, failed",
    "controller CPU (cores)",
    "controller RSS (most)",
    "API requests/s",
    "pod lists (reader/result)",
    "kube-apiserver cores",
    "the bench's lag",
    "load (1 min)",
    "replica measured",
)


def _pod_lists(lists: Mapping[str, float], seconds: float) -> str:
    if not any(lists.values()):
        return "none"
    total = sum(lists.values())
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(lists.items()) if v)
    return f"{total:,.0f} ({total / seconds:.2f}/s): {parts}"


def churn_row(nodes: int, churn: Churn | None) -> tuple[str, ...]:
    if churn is None:
        return (f"{nodes:,}", *("—" for _ in CHURN_HEADER[1:]))
    c = churn
    return (
        f"{nodes:,}",
        f"{_minutes(c.minutes)} min",
        f"{c.pods_deleted:,}, {c.pods_created:,}",
        f"{c.nodes_left}, {c.nodes_joined} ({c.node_pods_deleted:,}, {c.node_pods_created:,})",
        f"{c.lease_lost}, {c.leader_drops}",
        f"{c.unanswered} of {c.polls} ({c.slowest_poll:.2f} s)",
        f"{c.slow_rounds}, {c.failed_rounds}",
        f"{c.cpu_cores:.3f}",
        f"{c.rss_bytes / 2**20:,.0f} MiB",
        f"{c.requests_per_second:.2f}/s",
        _pod_lists(c.pod_lists, c.seconds),
        f"{c.apiserver_cores:.2f}",
        f"{c.behind:.1f} s",
        f"{c.load:.2f}",
        c.replica,
    )


def churn_grid(rows: Sequence[tuple[int, Churn | None]], poll_timeout: float) -> Grid:
    rates = sorted({(c.pods_per_second, c.node_seconds, c.away_steps) for _, c in rows if c is not None})
    stated = "; ".join(
        f"{p:g} pods replaced a second, a node leaving and one joining every {s:g} s (each away {a * s:g} s)"
        for p, s, a in rates
    )
    return Grid(
        "Controller scale curve: lease held while the fleet churns",
        "After the size's trials, the replica holding the lease (after a leader change, the standby) "
        f"is measured while the fleet churns at steady rates: {stated or 'none ran'}. Lease losses: "
        "its log's `leadership lost` lines, and the 1 → 0 transitions of `gpumon_controller_leader` "
        f"on its /metrics, polled once a second (a poll not answered within {poll_timeout:g} s is "
        "counted, not read). CPU, API requests (per ServiceAccount) and the API server's CPU over the "
        "whole phase; the pod lists are `gpumon_controller_pod_lists_total`'s increase. The bench's "
        "lag: how late its churn ran behind the schedule at worst. '—': the size ran before churn "
        "was measured.",
        CHURN_HEADER,
        tuple(churn_row(n, c) for n, c in sorted(rows, key=lambda r: r[0])),
    )

"""Scale planning for GPU node pools: a pure function of (cluster state, pools, now) -> plans.

For each pool the plan says how many replicas its ``/scale`` target should have, why, which
pending pods that is for, and which nodes to take out. The rules (docs/autoscaling.md):

- **Demand** is unschedulable GPU pods. They are placed by a bin-packing simulation
  (:mod:`gpumon.controller.core.demand`) first onto capacity already on its way, in any pool, then
  onto new nodes of the first pool (in config order) whose template can host them.
- **Arriving capacity** is replicas requested but not registered as nodes, and nodes that
  joined but whose GPU resources are not allocatable yet (device plugin starting); both count
  until ``arriving_timeout_seconds``. Pods a scale-up was for, or that arriving capacity took
  in, are remembered on the target (:class:`~gpumon.controller.core.pools.Record`): until that
  timeout they never cause a second scale-up, even in the moment between a node's GPUs
  becoming allocatable and the scheduler binding them.
- **Replacements**: each quarantined node of the pool adds one node, once.
- **Headroom**: ``headroom_nodes`` nodes without GPU pods are kept ready.
- **Bounds**: min/max (from cluster-autoscaler's annotations only when allowed), at most
  ``max_step`` nodes per change, cooldowns after scale-ups and scale-downs.
- **Scale-down** only of nodes without GPU pods (DaemonSets aside) for
  ``scale_down_unneeded_seconds``, never below min, never while pods are pending for the pool;
  the nodes are drained first, then marked and the replicas lowered (:func:`removal_record`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpumon.controller.core.contract import CA_MAX_ANNOTATION, CA_MIN_ANNOTATION, KARPENTER_NODEPOOL_LABEL
from gpumon.controller.core.contract.autoscaler import EMPTY_RECORD, Record, Removal, record_of
from gpumon.controller.core.demand import Packer, PodDemand, refusal, size, why_not_hosted
from gpumon.controller.core.pools import Pool, PoolNode, ScaleState

_NO_TIMES: Mapping[str, float] = MappingProxyType({})
_LISTED = 5  # pods or nodes named in a message before "and N more"
# After a pool's last arriving node became ready, how long the scheduler gets to bind the pods
# it was for before they count as unmet demand again.
SETTLE_SECONDS = 30.0


class Action(enum.StrEnum):
    NONE = "none"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"  # drain nodes now; lower replicas once they are empty
    FINISH_REMOVAL = "finish_removal"  # nodes already marked: lower replicas to the recorded count
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class PoolInput:
    """One pool as the shell sees it this round."""

    pool: Pool
    scale: ScaleState | None  # None when the target could not be read
    nodes: tuple[PoolNode, ...] = ()
    busy: frozenset[str] = frozenset()  # nodes running GPU pods (DaemonSet and mirror pods aside)
    # Since when each node has been seen without GPU pods (the shell's observation).
    idle_since: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)
    # When replicas above the registered nodes were first seen, for requests the record does not date.
    unregistered_since: float | None = None
    # Since when each node's GPUs have been seen allocatable (the shell's observation).
    ready_since: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)
    # Nodes whose removal was given up recently (drain timed out): not chosen again before then.
    skip_until: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)
    read_error: str = ""


@dataclass(frozen=True, slots=True)
class Note:
    """An Event for the target: reason, message, and whether it is a warning."""

    reason: str
    message: str
    warning: bool = False
    key: str = ""  # repeats with the same key are one Event (messages carry changing figures)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    pool: str
    action: Action
    current: int
    desired: int
    reason: str
    pods: tuple[str, ...] = ()  # namespace/name of the pods a scale-up is for
    drain: tuple[str, ...] = ()  # nodes to cordon and drain on the way out
    abandon: tuple[str, ...] = ()  # nodes whose removal stops: uncordon them
    record: Record = EMPTY_RECORD  # what to remember afterwards (written when it changed)
    record_changed: bool = False
    notes: tuple[Note, ...] = ()
    # Figures for metrics.
    pending: int = 0  # pending GPU pods this pool can host
    demand_nodes: int = 0  # nodes of the scale-up that are for pending pods (the rest: replacements, ...)
    arriving: int = 0  # arriving nodes (requested or without allocatable GPUs) still counted
    quarantined: int = 0
    min_replicas: int = 0
    max_replicas: int = 0


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return shown + (f" and {len(items) - _LISTED} more" if len(items) > _LISTED else "")


# ---------------------------------------------------------------------------------------------
# Bounds


def karpenter_owned(pool: Pool, nodes: Sequence[PoolNode]) -> str | None:
    """Why the pool is Karpenter's (its nodes carry Karpenter's NodePool label), or None."""
    owners = sorted({n.karpenter_nodepool for n in nodes if n.karpenter_nodepool is not None})
    if not owners:
        return None
    return (
        f"pool {pool.name}: its nodes are Karpenter's (NodePool {_names(owners)}, label "
        f"{KARPENTER_NODEPOOL_LABEL}): gpumon never scales what Karpenter manages"
    )


def bounds(pool: Pool, annotations: Mapping[str, str]) -> tuple[int, int] | str:
    """(min, max) for the pool, or why gpumon refuses to scale its target."""
    ca = {k: annotations[k] for k in (CA_MIN_ANNOTATION, CA_MAX_ANNOTATION) if k in annotations}
    if ca and not pool.allow_cluster_autoscaler:
        return (
            f"{pool.target} carries cluster-autoscaler's node-group annotations ({_names(sorted(ca))}): "
            "two autoscalers would fight over it; remove them or set allow_cluster_autoscaler"
        )
    try:
        ca_min = int(ca[CA_MIN_ANNOTATION]) if CA_MIN_ANNOTATION in ca else None
        ca_max = int(ca[CA_MAX_ANNOTATION]) if CA_MAX_ANNOTATION in ca else None
    except ValueError:
        return f"{pool.target}: cluster-autoscaler's min/max annotations are not integers"
    low = pool.min_replicas if pool.min_replicas is not None else (ca_min or 0)
    high = pool.max_replicas if pool.max_replicas is not None else ca_max
    if high is None:
        return f"pool {pool.name} has no max_replicas and {pool.target} no {CA_MAX_ANNOTATION}"
    if low < 0 or low > high:
        return f"pool {pool.name}: min {low} > max {high}"
    return low, high


# ---------------------------------------------------------------------------------------------
# One pool's picture before placing demand


def _healthy(n: PoolNode) -> bool:
    return not n.quarantined and not n.excluded


def _idle(inp: PoolInput, n: PoolNode) -> bool:
    return _healthy(n) and n.removing_since is None and not n.unschedulable and n.name not in inp.busy


@dataclass(slots=True)
class _Pool:
    """Working state of one pool while planning (mutable, private to :func:`plan_pools`)."""

    input: PoolInput
    scale: ScaleState
    record: Record
    removal: Removal | None  # the scale-down under way, while its nodes exist
    low: int
    high: int
    live: list[PoolNode]  # registered, not deleting, not marked for deletion
    registered: int  # nodes the replicas still account for
    broken: list[PoolNode]  # joined, GPUs never became allocatable within the timeout
    stuck: int  # requested, never registered within the timeout
    settling: bool  # arriving capacity, or some just arrived: provided-for pods keep waiting
    arriving: int  # nodes requested or joined without allocatable GPUs, within the timeout
    packer: Packer  # its initial nodes: the arriving ones, then the idle ready ones
    provided: dict[str, float] = field(default_factory=dict)  # pod uid -> when, kept on the record
    hosted: dict[str, PodDemand] = field(default_factory=dict)  # pending pods the template hosts
    for_new: list[str] = field(default_factory=list)  # pods placed on new nodes
    left: list[PodDemand] = field(default_factory=list)  # hosted, but no room (max, step)

    @property
    def pool(self) -> Pool:
        return self.input.pool

    @property
    def current(self) -> int:
        return self.scale.spec_replicas

    @property
    def base(self) -> int:
        """What a scale-up adds to: replicas, or the machines still there when more than that
        (some on their way out; raising replicas would first keep them rather than add any)."""
        return max(self.current, self.registered)

    @property
    def room(self) -> int:
        """New nodes this round may add."""
        return max(0, min(self.high - self.base, self.pool.max_step))


def _prepare(inp: PoolInput, now: float) -> _Pool | PoolPlan:
    pool = inp.pool
    if inp.scale is None:
        why = f"cannot read {pool.target}: {inp.read_error or 'unknown error'}"
        return PoolPlan(pool.name, Action.REFUSED, 0, 0, why, notes=(Note("GpuPoolUnreadable", why, True),))
    scale = inp.scale
    limits = karpenter_owned(pool, inp.nodes) or bounds(pool, scale.annotations)
    if isinstance(limits, str):
        n = scale.spec_replicas
        return PoolPlan(
            pool.name, Action.REFUSED, n, n, limits, notes=(Note("GpuPoolRefused", limits, True),)
        )
    record = record_of(scale.annotations)
    present = [n for n in inp.nodes if not n.deleting]
    removal = record.removal
    if removal is not None and not any(n.name in removal.nodes for n in present):
        removal = None  # its nodes are gone: done
    # Nodes whose removal the replicas already reflect are no longer part of the count.
    gone = (
        set(removal.nodes) if removal is not None and scale.spec_replicas != removal.from_replicas else set()
    )
    registered = len([n for n in present if n.name not in gone])
    unregistered = max(0, scale.spec_replicas - registered)
    timeout = pool.arriving_timeout_seconds
    since = record.scaled_up_at if record.scaled_up_at is not None else inp.unregistered_since
    requested = unregistered if since is None or now - since < timeout else 0
    # Nodes marked for deletion are on their way out, except those gpumon marked itself whose
    # removal it has not recorded yet (it stopped in between): it carries on with them.
    removing = set(removal.nodes) if removal is not None else set()
    live = [n for n in present if not n.marked or (n.removing_since is not None and n.name not in removing)]
    waiting = [n for n in live if not n.gpus_allocatable and not n.quarantined]
    arriving = requested + len([n for n in waiting if now - n.created_at < timeout])
    # Ready nodes without GPU pods are room too: pods the scheduler will bind there any moment,
    # or pods it will not for reasons a template does not show, which more nodes would not fix.
    idle_ready = [n for n in live if n.gpus_allocatable and _idle(inp, n)]
    # Nodes being drained for removal too, last: pending pods that fit there call the removal off.
    idle_ready += [
        n
        for n in live
        if n.removing_since is not None and n.gpus_allocatable and _healthy(n) and n.name not in inp.busy
    ]
    newest_ready = max((inp.ready_since.get(n.name, 0.0) for n in live if n.gpus_allocatable), default=0.0)
    return _Pool(
        input=inp,
        scale=scale,
        record=record,
        removal=removal,
        low=limits[0],
        high=limits[1],
        live=live,
        registered=registered,
        broken=[n for n in waiting if now - n.created_at >= timeout],
        stuck=unregistered - requested,
        settling=arriving > 0 or now - newest_ready < SETTLE_SECONDS,
        arriving=arriving,
        packer=Packer(pool.template, arriving + len(idle_ready)),
    )


# ---------------------------------------------------------------------------------------------
# Placing demand


def _place(pools: list[_Pool], pending: Sequence[PodDemand], now: float) -> None:
    templates = [p.pool.template for p in pools]
    # A pod refused anywhere (a DRA selector with no value on some template) is demand nowhere.
    pending = [pod for pod in pending if refusal(pod, templates) is None]
    for pod in pending:
        for p in pools:
            if why_not_hosted(p.pool.template, pod) is None:
                p.hosted[pod.uid] = pod

    def biggest_first(pod: PodDemand) -> tuple[float, str]:
        # First-fit-decreasing, by the pod's size on the first pool that hosts it.
        first = next((p for p in pools if pod.uid in p.hosted), None)
        return (-(size(pod, first.pool.template) if first else 0.0), pod.key)

    ordered = sorted(pending, key=biggest_first)
    # 1. Pods a pool provided for keep their claim while its capacity arrives and settles:
    #    never a second scale-up for the same pods before the arriving timeout.
    claimed: set[str] = set()
    for p in pools:
        for pod in ordered:
            at = p.record.provided.get(pod.uid)
            if at is None or pod.uid in claimed or pod.uid not in p.hosted:
                continue
            if now - at >= p.pool.arriving_timeout_seconds or not p.settling:
                continue
            p.packer.place(pod, may_open=False)
            p.provided[pod.uid] = at
            claimed.add(pod.uid)
    # 2. Other pods take what arriving capacity is left, in any pool.
    rest: list[PodDemand] = []
    for pod in ordered:
        if pod.uid in claimed:
            continue
        home = next(
            (p for p in pools if pod.uid in p.hosted and p.packer.place(pod, may_open=False) is not None),
            None,
        )
        if home is not None:
            home.provided[pod.uid] = now
        else:
            rest.append(pod)
    # 3. New nodes, in config order, within each pool's room: higher priority first.
    for pod in sorted(rest, key=lambda pod: -pod.priority):  # stable: biggest first within a priority
        hosts = [p for p in pools if pod.uid in p.hosted]
        home = next(
            (p for p in hosts if p.packer.place(pod, may_open=p.packer.new_nodes < p.room) is not None), None
        )
        if home is not None:
            home.provided[pod.uid] = now
            home.for_new.append(pod.key)
        elif hosts:
            hosts[0].left.append(pod)


# ---------------------------------------------------------------------------------------------
# Deciding per pool


def _removals(p: _Pool, now: float) -> tuple[list[str], list[tuple[str, str]]]:
    """Scale-downs under way: (nodes whose drain goes on, (node, why) removals to give up)."""
    pool, inp = p.pool, p.input
    abandon: list[tuple[str, str]] = []
    keep: list[str] = []
    for n in p.live:
        if n.removing_since is None:
            continue
        if n.name in inp.busy:
            abandon.append((n.name, "a GPU pod runs on it"))
        elif not _healthy(n):
            abandon.append((n.name, "it was quarantined or excluded"))
        elif p.hosted:
            abandon.append((n.name, f"{len(p.hosted)} GPU pod(s) are pending for the pool"))
        elif now - n.removing_since >= pool.scale_down_drain_timeout_seconds:
            timeout = pool.scale_down_drain_timeout_seconds
            abandon.append((n.name, f"its drain did not finish within {timeout:.0f}s"))
        else:
            keep.append(n.name)
    room = max(0, p.current - p.low)  # replicas changed since the removal began: min still holds
    abandon += [(name, f"the pool is at its min size {p.low}") for name in keep[room:]]
    return keep[:room], abandon


def _scale_down(p: _Pool, now: float, keep: list[str]) -> tuple[list[str], list[Note]]:
    """Nodes to drain (those under way first) and notes."""
    pool, inp = p.pool, p.input
    last = max((t for t in (p.record.scaled_up_at, p.record.scaled_down_at) if t is not None), default=None)
    cooling = last is not None and now - last < pool.scale_down_cooldown_seconds
    if p.hosted or cooling or p.current - len(keep) <= p.low:
        return keep, []
    broken = {n.name for n in p.broken}
    idle = [
        n
        for n in p.live
        if _idle(inp, n)
        and (n.gpus_allocatable or n.name in broken)
        and inp.skip_until.get(n.name, 0.0) <= now
    ]
    unneeded = sorted(
        (n for n in idle if now - inp.idle_since.get(n.name, now) >= pool.scale_down_unneeded_seconds),
        # Broken nodes first, then the longest idle.
        key=lambda n: (n.name not in broken, inp.idle_since.get(n.name, now), n.name),
    )
    budget = min(pool.max_step, p.current - p.low) - len(keep)
    # Headroom: keep that many empty nodes (empty arriving ones count; broken ones never do).
    spare_arriving = p.packer.still_empty(0, p.arriving)
    surplus = len([n for n in idle if n.name not in broken]) + spare_arriving - pool.headroom_nodes
    chosen: list[PoolNode] = []
    for n in unneeded:
        if len(chosen) >= budget:
            break
        if n.name not in broken:
            if surplus <= 0:
                continue
            surplus -= 1
        chosen.append(n)
    notes = []
    if chosen:
        idle_for = ", ".join(f"{n.name} (idle {now - inp.idle_since.get(n.name, now):.0f}s)" for n in chosen)
        names = ",".join(n.name for n in chosen)
        msg = f"draining {idle_for} to remove from {pool.target}"
        notes.append(Note("GpuPoolScaleDown", msg, key=f"down:{names}"))
    return keep + [n.name for n in chosen], notes


def _decide(p: _Pool, now: float) -> PoolPlan:
    pool, record, current = p.pool, p.record, p.current
    quarantined = [n for n in p.live if n.quarantined]
    notes: list[Note] = []
    if p.stuck:
        notes.append(
            Note(
                "GpuPoolNodesNotRegistered",
                f"{p.stuck} requested node(s) of {pool.target} did not register within "
                f"{pool.arriving_timeout_seconds:.0f}s: no longer counted as arriving capacity",
                warning=True,
                key=f"stuck:{p.stuck}",
            )
        )
    for n in p.broken:
        notes.append(
            Note(
                "GpuPoolGpusNotAllocatable",
                f"node {n.name} joined {now - n.created_at:.0f}s ago but its GPU resources are not "
                "allocatable (device plugin?): not counted as capacity",
                warning=True,
                key=f"broken:{n.name}",
            )
        )
    # Remember only what still matters: pending pods, nodes still quarantined.
    replaced = {k: v for k, v in record.replaced.items() if k in {n.name for n in quarantined}}
    provided = dict(p.provided)
    base = PoolPlan(
        pool.name,
        Action.NONE,
        current,
        current,
        "no change needed",
        pending=len(p.hosted),
        arriving=p.arriving,
        quarantined=len(quarantined),
        min_replicas=p.low,
        max_replicas=p.high,
    )

    def finish(plan: PoolPlan, rec: Record) -> PoolPlan:
        return replace(plan, record=rec, record_changed=rec != record, notes=(*notes, *plan.notes))

    # A scale-down whose replicas patch did not happen yet: finish it first.
    removal = p.removal
    if removal is not None and current == removal.from_replicas:
        rec = replace(record, provided=MappingProxyType(provided), replaced=MappingProxyType(replaced))
        why = f"removing {_names(list(removal.nodes))}, already drained and marked for deletion"
        return finish(
            replace(base, action=Action.FINISH_REMOVAL, desired=removal.to_replicas, reason=why), rec
        )

    keep, abandon = _removals(p, now)
    notes += [Note("GpuPoolScaleDownCancelled", f"not removing node {name}: {why}") for name, why in abandon]
    gave_up = tuple(name for name, _ in abandon)

    # Growth: demand on new nodes, then replacements, then headroom; at least min.
    demand_nodes = p.packer.new_nodes
    room = p.room - demand_nodes
    due = sorted(n.name for n in quarantined if n.name not in replaced) if pool.replace_quarantined else []
    replacing = due[: max(0, room)]
    room -= len(replacing)
    headroom = 0
    if not demand_nodes and not replacing:  # else look again once the new nodes are in
        headroom = min(max(0, pool.headroom_nodes - p.packer.still_empty()), max(0, room))
    add = demand_nodes + len(replacing) + headroom
    below_min = p.base < p.low
    if below_min:
        add = max(add, min(p.low - p.base, pool.max_step))
    up_at = record.scaled_up_at
    if add and not below_min and up_at is not None and now - up_at < pool.scale_up_cooldown_seconds:
        wait = pool.scale_up_cooldown_seconds - (now - up_at)
        notes.append(
            Note(
                "GpuPoolScaleUpDeferred",
                f"scale-up of {pool.target} by {add} waits {wait:.0f}s of cooldown",
                key=f"cooldown:{up_at}",
            )
        )
        for key in p.for_new:  # not requested, so not provided for
            uid = next(pod.uid for pod in p.hosted.values() if pod.key == key)
            provided.pop(uid, None)
        add, replacing, demand_nodes = 0, [], 0
        p.for_new.clear()
    if p.left:
        limit = "max size" if p.high - current <= pool.max_step else f"step limit ({pool.max_step})"
        notes.append(
            Note(
                "GpuPoolAtLimit",
                f"{len(p.left)} pending GPU pod(s) fit {pool.target} but it is at its {limit}, "
                f"max {p.high}: {_names([x.key for x in p.left])}",
                warning=True,
                key=f"limit:{limit}:{len(p.left)}",
            )
        )
    replaced.update({name: now for name in replacing})
    if add:
        causes = []
        if demand_nodes:
            causes.append(f"{len(p.for_new)} pending GPU pod(s) need {demand_nodes} node(s)")
        if replacing:
            causes.append(f"replacing quarantined {_names(replacing)}")
        if headroom:
            causes.append(f"headroom of {pool.headroom_nodes} empty node(s)")
        if below_min:
            causes.append(f"min size {p.low}")
        reason = f"scaling {pool.target} {current} -> {p.base + add}: " + "; ".join(causes)
        if p.for_new:
            reason += f" ({_names(p.for_new)})"
        rec = replace(
            record,
            provided=MappingProxyType(provided),
            replaced=MappingProxyType(replaced),
            scaled_up_at=now,
            removal=removal,
        )
        plan = replace(
            base,
            action=Action.SCALE_UP,
            desired=p.base + add,
            reason=reason,
            pods=tuple(p.for_new),
            demand_nodes=demand_nodes,
            abandon=gave_up,
            notes=(Note("GpuPoolScaleUp", reason),),
        )
        return finish(plan, rec)

    drain, down_notes = _scale_down(p, now, keep)
    rec = replace(
        record, provided=MappingProxyType(provided), replaced=MappingProxyType(replaced), removal=removal
    )
    if drain:
        reason = f"draining {_names(drain)} to scale {pool.target} down"
        plan = replace(
            base,
            action=Action.SCALE_DOWN,
            reason=reason,
            drain=tuple(drain),
            abandon=gave_up,
            notes=tuple(down_notes),
        )
        return finish(plan, rec)
    if p.hosted:
        reason = f"{len(p.hosted)} pending GPU pod(s) wait for capacity already requested or at a limit"
        return finish(replace(base, reason=reason, abandon=gave_up), rec)
    return finish(replace(base, abandon=gave_up), rec)


def plan_pools(inputs: Sequence[PoolInput], pending: Sequence[PodDemand], now: float) -> tuple[PoolPlan, ...]:
    """One plan per pool, in the order given: config order, which is also the order in which
    pools are offered demand that several of them could host."""
    prepared = [_prepare(inp, now) for inp in inputs]
    _place([p for p in prepared if isinstance(p, _Pool)], pending, now)
    return tuple(p if isinstance(p, PoolPlan) else _decide(p, now) for p in prepared)


def removal_record(plan: PoolPlan, drained: Sequence[str], now: float) -> tuple[Record, int]:
    """After draining: the record to write (before the /scale patch) and the replicas to set,
    to remove the ``drained`` nodes of a scale-down plan."""
    to = plan.current - len(drained)
    if to < plan.min_replicas:
        raise ValueError(f"removing {len(drained)} of {plan.current} would go below min {plan.min_replicas}")
    removal = Removal(tuple(sorted(drained)), plan.current, to, now)
    return replace(plan.record, removal=removal, scaled_down_at=now), to

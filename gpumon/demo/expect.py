"""The cluster state each step waits for, as pure checks of a :class:`ClusterView`: met or
not, with a line saying what was seen (shown when met, and in the error when the deadline
passes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpumon.demo.scenario import Expect
from gpumon.demo.views import ClusterView, NodeRow


@dataclass(frozen=True, slots=True)
class Broken:
    """A GPU a step broke, and the pods that held it then."""

    node: str
    gpu: int
    victims: tuple[str, ...]  # namespace/name


@dataclass(frozen=True, slots=True)
class StepContext:
    apps: Mapping[str, int]  # app -> replicas that should be Running
    attributed_app: str  # whose pods the exporters must place on GPUs before a fault makes sense
    pool_desired_before: int  # the pool's replicas when the step began
    broken: tuple[Broken, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpectOutcome:
    met: bool
    detail: str


def _apps(view: ClusterView, apps: Mapping[str, int]) -> tuple[bool, str]:
    parts, ok = [], True
    for app, want in sorted(apps.items()):
        pods = view.pods_of(app)
        running = sum(p.running for p in pods)
        pending = sum(p.phase == "Pending" and not p.deleting for p in pods)
        ok &= running == want and pending == 0
        parts.append(f"{app} {running}/{want} Running" + (f", {pending} Pending" if pending else ""))
    return ok, ", ".join(parts)


def _pool(view: ClusterView) -> tuple[int, int, int]:
    """(desired replicas, pool nodes, of which with GPUs allocatable)."""
    nodes = view.pool_nodes()
    desired = view.pool.desired if view.pool is not None else 0
    return desired, len(nodes), sum(bool(n.gpu_resources) for n in nodes)


def _unattributed(view: ClusterView, app: str) -> list[str]:
    """Running pods of ``app`` their node's exporter does not (yet) place on a GPU."""
    out = []
    for p in view.pods_of(app):
        if not p.running or p.node is None:
            continue
        if not any(p.key in g.pods for g in view.gpus.get(p.node, ())):
            out.append(p.name)
    return out


def steady(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    apps_ok, apps = _apps(view, ctx.apps)
    desired, joined, available = _pool(view)
    problems = [f"{n.name} NotReady" for n in view.nodes if not n.ready]
    problems += [f"{n.name} tainted {n.taint}" for n in view.nodes if n.taint]
    problems += [f"{n.name}: no exporter answer" for n in view.nodes if n.name not in view.gpus]
    problems += [f"{p} not placed on a GPU yet" for p in _unattributed(view, ctx.attributed_app)]
    if not (desired == joined == available):
        problems.append(f"pool {available}/{desired} nodes with GPUs")
    met = apps_ok and not problems
    return ExpectOutcome(
        met,
        f"{len(view.nodes)} nodes Ready, pool {available}/{desired}, {apps}"
        + ("" if met else "; " + "; ".join(problems)),
    )


def _each_broken(
    view: ClusterView, ctx: StepContext, judge: Callable[[Broken, NodeRow], tuple[bool, str]]
) -> tuple[bool, list[str]]:
    """``judge`` applied to every broken GPU's node; a node that is gone fails."""
    ok, parts = True, []
    for b in ctx.broken:
        node = view.node(b.node)
        good, text = (False, f"{b.node} is gone") if node is None else judge(b, node)
        ok &= good
        parts.append(text)
    return ok, parts


def quarantined(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    alive = {p.key for p in view.pods if p.running}

    def judge(b: Broken, node: NodeRow) -> tuple[bool, str]:
        condition = f"True ({node.condition_reason})" if node.condition else "not set"
        still = [v for v in b.victims if v in alive]
        evicted = ", ".join(v.split("/", 1)[1] for v in b.victims) or "no pod held it"
        return (
            node.taint is not None and node.condition and not still,
            f"{b.node} GPU {b.gpu}: taint {node.taint or 'none'}, GpuUnhealthy={condition}; "
            + (f"still running: {', '.join(still)}" if still else f"evicted: {evicted}"),
        )

    apps_ok, apps = _apps(view, ctx.apps)
    ok, parts = _each_broken(view, ctx, judge)
    return ExpectOutcome(ok and apps_ok, "; ".join([*parts, apps]))


def scaled_up(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    apps_ok, apps = _apps(view, ctx.apps)
    desired, joined, available = _pool(view)
    met = apps_ok and desired > ctx.pool_desired_before and available == desired
    return ExpectOutcome(
        met,
        f"pool {ctx.pool_desired_before} -> {desired} replicas "
        f"({joined} joined, {available} with GPUs), {apps}",
    )


def _lifted(view: ClusterView, b: Broken, node: NodeRow) -> tuple[bool, str]:
    """The quarantine is off the node: taint and condition gone."""
    gpu_state = next((g.state for g in view.gpus.get(b.node, ()) if g.index == b.gpu), "unknown")
    return (
        node.taint is None and not node.condition,
        f"{gpu_state}: taint {node.taint or 'lifted'}, GpuUnhealthy={'True' if node.condition else 'False'}",
    )


def recovered(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    def judge(b: Broken, node: NodeRow) -> tuple[bool, str]:
        lifted, text = _lifted(view, b, node)
        return lifted, f"{b.node} GPU {b.gpu} {text}"

    ok, parts = _each_broken(view, ctx, judge)
    return ExpectOutcome(ok, "; ".join(parts))


def repaired(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    """Recovered through gpumon's repair: its reset Job and its validation Job succeeded on the
    node, and the quarantine lifted."""

    def steps(node: str) -> str:
        parts = []
        for step in ("reset", "validate"):
            states = [j.state for j in view.jobs_of(node, step)]
            parts.append(f"{step} Job {states[-1] if states else 'not created'}")
        return ", ".join(parts)

    def judge(b: Broken, node: NodeRow) -> tuple[bool, str]:
        lifted, text = _lifted(view, b, node)
        done = all(
            any(j.state == "succeeded" for j in view.jobs_of(b.node, s)) for s in ("reset", "validate")
        )
        return lifted and done, f"{b.node}: {steps(b.node)}; GPU {b.gpu} {text}"

    ok, parts = _each_broken(view, ctx, judge)
    return ExpectOutcome(ok, "; ".join(parts))


def scaled_down(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    apps_ok, apps = _apps(view, ctx.apps)
    desired, joined, _ = _pool(view)
    met = apps_ok and desired < ctx.pool_desired_before and joined == desired
    return ExpectOutcome(
        met, f"pool {ctx.pool_desired_before} -> {desired} replicas ({joined} nodes left), {apps}"
    )


def replaced(view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    """The broken GPUs' machines were replaced through the pool's own machinery: each such node
    is gone, the pool has as many nodes with GPUs as it asked for when the step began (a swap,
    never a scale-down), and every app is back at full strength."""
    apps_ok, apps = _apps(view, ctx.apps)
    desired, joined, available = _pool(view)
    gone = [b.node for b in ctx.broken if view.node(b.node) is None]
    left = [b.node for b in ctx.broken if b.node not in gone]
    met = apps_ok and not left and desired == joined == available == ctx.pool_desired_before
    parts = [f"{n} gone" for n in gone] + [f"{n} still there" for n in left]
    parts.append(f"pool {available}/{desired} nodes with GPUs (was {ctx.pool_desired_before}), {apps}")
    return ExpectOutcome(met, "; ".join(parts))


CHECKS = {
    Expect.STEADY: steady,
    Expect.QUARANTINED: quarantined,
    Expect.SCALED_UP: scaled_up,
    Expect.RECOVERED: recovered,
    Expect.REPAIRED: repaired,
    Expect.SCALED_DOWN: scaled_down,
    Expect.REPLACED: replaced,
}


def check(expect: Expect, view: ClusterView, ctx: StepContext) -> ExpectOutcome:
    return CHECKS[expect](view, ctx)

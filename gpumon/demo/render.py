"""Showing a :class:`ClusterView`: a rich table for the terminal (nodes, GPUs with health,
utilization and pods, taints, the pool, the controller's latest actions), or, for CI, plain log
lines describing what changed since the previous view. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpumon.demo.views import ClusterView, GpuView, NodeRow

_STATE_STYLE = {"healthy": "green", "degraded": "yellow", "unhealthy": "red", "lost": "bold red"}
_EVENTS_SHOWN = 8


@dataclass(frozen=True, slots=True)
class HeaderStatus:
    """What the scenario runner is doing, for the header."""

    title: str
    detail: str = ""
    elapsed: float = 0.0
    links: Sequence[tuple[str, str]] = field(default_factory=tuple)  # (what, where)


def _short(pod: str) -> str:
    return pod.split("/", 1)[-1]


def _gpu_line(g: GpuView) -> Text:
    line = Text(f"{g.index} ")
    line.append(f"{g.state:<9}", style=_STATE_STYLE.get(g.state, "dim"))
    line.append(f" {g.utilization * 100:3.0f}% " if g.utilization is not None else "   -  ")
    line.append(", ".join(_short(p) for p in g.pods) or "-", style="cyan" if g.pods else "dim")
    return line


def _node_state(n: NodeRow) -> Text:
    out = Text()
    out.append("Ready" if n.ready else "NotReady", style="green" if n.ready else "red")
    if n.unschedulable:
        out.append(" cordoned", style="yellow")
    if n.taint:
        out.append(f"\ntaint {n.taint}", style="red")
    if n.condition:
        out.append(f"\nGpuUnhealthy: {n.condition_reason}", style="red")
    if n.state:
        out.append(f"\n{n.state}", style="magenta")
    return out


def _kind(n: NodeRow) -> str:
    if n.pool:
        return f"pool {n.pool}"
    if n.os == "windows":
        return "windows"
    return "shared" if any(k.startswith("aliyun.com/") for k in n.gpu_resources) else "static"


def table(view: ClusterView | None, status: HeaderStatus, milestones: Sequence[str] = ()) -> RenderableType:
    """The whole screen: what the demo is doing, its milestones so far, then the cluster."""
    header = Text(status.title, style="bold")
    header.append(f"   {status.elapsed:5.0f} s")
    if status.detail:
        header.append(f"\n{status.detail}")
    for what, where in status.links:
        header.append(f"\n{what}: ", style="dim")
        header.append(where)
    top = [Panel(header, title="gpumon demo")]
    if milestones:
        top.append(Panel(Text("\n".join(milestones)), title="scenario"))
    if view is None:
        return Group(*top)
    return Group(*top, *_cluster(view))


def _cluster(view: ClusterView) -> list[RenderableType]:
    nodes = Table(expand=True, show_lines=True)
    for col, kw in (
        ("node", {"no_wrap": True}),
        ("kind", {}),
        ("state", {}),
        ("GPUs: index, health, utilization, pods", {"ratio": 1}),
    ):
        nodes.add_column(col, **kw)  # type: ignore[arg-type]
    for n in view.nodes:
        gpus = view.gpus.get(n.name)
        missing = "GPUs not offered yet" if not n.gpu_resources else "no exporter answer"
        cell: RenderableType = (
            Text("\n").join(_gpu_line(g) for g in gpus) if gpus else Text(missing, style="dim")
        )
        nodes.add_row(n.name, _kind(n), _node_state(n), cell)
    pending = [p for p in view.pods if p.node is None and not p.deleting]
    pool = view.pool
    summary = Text()
    if pool is not None:
        summary.append(
            f"pool {pool.name}: {pool.desired} wanted, {pool.replicas} machines, {pool.available} with GPUs",
            style="bold",
        )
    summary.append(f"   pods: {sum(p.running for p in view.pods)} Running, {len(pending)} Pending")
    events = Table(expand=True, box=None, show_header=False)
    events.add_column("reason", no_wrap=True)
    events.add_column("object", no_wrap=True)
    events.add_column("message", ratio=1)
    for e in view.events[-_EVENTS_SHOWN:]:
        events.add_row(Text(e.reason, style="yellow" if e.warning else "green"), e.about, e.message)
    return [nodes, summary, Panel(events, title="controller actions (Events)")]


def _node_facts(n: NodeRow, gpus: Sequence[GpuView] | None) -> dict[str, str]:
    facts = {
        "ready": "Ready" if n.ready else "NotReady",
        "taint": f"taint {n.taint}" if n.taint else "no taint",
        "condition": f"GpuUnhealthy=True ({n.condition_reason})" if n.condition else "GpuUnhealthy not set",
        "state": f"state {n.state}" if n.state else "no gpumon state",
        "cordon": "cordoned" if n.unschedulable else "schedulable",
        "gpus": "GPUs allocatable" if n.gpu_resources else "GPUs not allocatable",
    }
    for g in gpus or ():
        facts[f"gpu{g.index}"] = f"GPU {g.index} {g.state}"
    return facts


def changes(before: ClusterView | None, after: ClusterView) -> list[str]:
    """One line per change worth telling: nodes, their taints, conditions and GPUs, the pool,
    pods of each app, new controller events."""
    lines: list[str] = []
    old_nodes = {n.name: n for n in before.nodes} if before else {}
    for n in after.nodes:
        facts = _node_facts(n, after.gpus.get(n.name))
        if n.name not in old_nodes:
            lines.append(f"node {n.name} joined ({_kind(n)}): " + ", ".join(facts.values()))
            continue
        assert before is not None
        old = _node_facts(old_nodes[n.name], before.gpus.get(n.name))
        diff = [v for k, v in facts.items() if old.get(k) != v]
        if diff:
            lines.append(f"node {n.name}: " + ", ".join(diff))
    lines += [f"node {name} left" for name in old_nodes if after.node(name) is None]
    if after.pool is not None and (before is None or before.pool != after.pool):
        p = after.pool
        lines.append(f"pool {p.name}: {p.desired} wanted, {p.replicas} machines, {p.available} with GPUs")
    for app in sorted({p.app for p in after.pods} | {p.app for p in (before.pods if before else ())}):
        now = _app_summary(after, app)
        if before is None or _app_summary(before, app) != now:
            lines.append(f"pods {app}: {now}")
    seen = set(before.events) if before else set()
    lines += [f"controller: {e.reason} {e.about}: {e.message}" for e in after.events if e not in seen]
    return lines


def _app_summary(view: ClusterView, app: str) -> str:
    pods = view.pods_of(app)
    placed: dict[str, int] = {}
    for p in pods:
        if p.running and p.node:
            placed[p.node] = placed.get(p.node, 0) + 1
    pending = sum(p.node is None and not p.deleting for p in pods)
    where = ", ".join(f"{node} {count}" for node, count in sorted(placed.items()))
    waiting = f", {pending} Pending" if pending else ""
    return f"{sum(placed.values())} Running ({where or 'nowhere'}){waiting}"

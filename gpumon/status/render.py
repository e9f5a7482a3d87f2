"""Status views for people (rich renderables) and for machines (plain JSON-able values)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpumon.status.allocation import AllocationView, CardAllocation, Holder, NodeAllocation
from gpumon.status.model import (
    ControllerStatus,
    Explanation,
    FleetStatus,
    GpuCounts,
    GpuProblem,
    NodeStatus,
    RepairLadder,
    ScaleTargetStatus,
)
from gpumon.status.times import duration


def to_jsonable(value: Any) -> Any:
    """Frozen dataclasses, enums, mappings and sets as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, tuple | list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


_SEVERITY_STYLE = {"unhealthy": "bold red", "degraded": "yellow", "lost": "bold red"}


def dumps(view: FleetStatus | Explanation | AllocationView, output: str, *, stream: bool = False) -> str:
    """One JSON or YAML document, ending in a newline. In a ``stream`` (``--watch``), JSON takes
    one line per document and YAML documents start with ``---``."""
    doc = to_jsonable(view)
    if output == "yaml":
        return ("---\n" if stream else "") + yaml.safe_dump(doc, sort_keys=False)
    return json.dumps(doc, indent=None if stream else 2) + "\n"


def _table(title: str, *columns: str, short: tuple[str, ...] = ()) -> Table:
    """``short`` columns hold a number or a word: never wrapped, so the others get the room."""
    t = Table(title=title, title_justify="left", title_style="bold", expand=True)
    for col in columns:
        t.add_column(col, overflow="fold", no_wrap=col in short)
    return t


def gpu_counts(g: GpuCounts) -> Text:
    t = Text(f"{g.healthy} healthy", style="green")
    for name in ("degraded", "unhealthy", "lost"):
        n = getattr(g, name)
        if n:
            t.append(f", {n} {name}", style=_SEVERITY_STYLE[name])
    return t


def controller_line(ctl: ControllerStatus) -> Text:
    line = Text("controller: ", style="bold")
    if ctl.reachable:
        line.append(f"answering at {ctl.source}")
        if ctl.leader is not None:
            line.append(" (leader)" if ctl.leader else " (a standby replica answered)")
    else:
        line.append(f"/metrics not reachable ({ctl.error or 'not read'})", style="yellow")
    mode = {True: ("dry-run", "yellow"), False: ("acting", "green"), None: ("mode unknown", "dim")}[
        ctl.dry_run
    ]
    line.append("; ")
    line.append(
        mode[0] + (f" (from {ctl.dry_run_from})" if ctl.dry_run_from == "events" else ""), style=mode[1]
    )
    if ctl.paused:
        line.append("; PAUSED", style="bold yellow")
    if ctl.signals:
        line.append("; signals " + ", ".join(f"{int(n)} {s}" for s, n in sorted(ctl.signals.items())))
    if ctl.evictions:
        line.append("; evictions " + ", ".join(f"{int(n)} {r}" for r, n in sorted(ctl.evictions.items())))
    return line


def _problem(p: GpuProblem) -> Text:
    where = "node" if p.index is None else f"GPU {p.index}"
    t = Text(f"{where}: ")
    t.append(p.reason, style=_SEVERITY_STYLE.get(p.severity, ""))
    t.append(f" [{', '.join(p.rules)}]")
    if p.evidence:
        t.append(f" {p.evidence}", style="dim")
    return t


def _notes(n: NodeStatus) -> str:
    notes = []
    if not n.ready:
        notes.append("NotReady")
    if n.cordoned:
        notes.append("cordoned by a person" if n.cordoned_by_person else "cordoned")
    if n.excluded:
        notes.append("excluded")
    return ", ".join(notes)


_MACHINERY = {"cluster-api": "Cluster API", "karpenter": "Karpenter", "none": "none"}


def _owned_by(n: NodeStatus) -> str:
    """What owns the node: ``Karpenter (NodeClaim gpu-x)``, ``none``."""
    name = _MACHINERY.get(n.machinery, n.machinery)
    return f"{name} ({n.owner})" if n.owner else name


def _replicas(plan: ScaleTargetStatus) -> str:
    def n(v: int | None) -> str:
        return "?" if v is None else str(v)

    text = f"{n(plan.current)} of {n(plan.desired)}"
    if plan.min_replicas is not None or plan.max_replicas is not None:
        text += f" ({n(plan.min_replicas)}..{n(plan.max_replicas)})"
    return text


def _plan(plan: ScaleTargetStatus) -> Text:
    if plan.error is not None:
        return Text(f"cannot read: {plan.error}", style="yellow")
    lines = []
    if plan.last_decision:
        lines.append(f"{plan.last_decision_at}: {plan.last_decision}")
    if plan.scaled_up_at:
        lines.append(f"scaled up at {plan.scaled_up_at} for {plan.pods_provided_for} pending pod(s)")
    if plan.replacing:
        lines.append("replacing quarantined " + ", ".join(plan.replacing))
    if plan.removing:
        lines.append("scaling down: removing " + ", ".join(plan.removing))
    if plan.scaled_down_at:
        lines.append(f"scaled down at {plan.scaled_down_at}")
    return Text("\n".join(lines) or "-")


def fleet(view: FleetStatus) -> RenderableType:
    parts: list[RenderableType] = [
        Text(f"gpumon status at {view.taken_at}", style="bold"),
        controller_line(view.controller),
    ]
    pools = _table(
        "Pools", "pool", "nodes", "owned by", "GPUs", "quarantined", "breaker", short=("nodes", "quarantined")
    )
    for p in view.pools:
        breaker = Text("open since " + p.breaker.opened_at, style="bold red") if p.breaker else Text("closed")
        owned = ", ".join(f"{_MACHINERY.get(m, m)} {k}" for m, k in p.machinery.items()) or "-"
        pools.add_row(p.name, str(p.nodes), owned, gpu_counts(p.gpus), str(p.quarantined), breaker)
    parts.append(pools)
    if view.quarantined:
        q = _table(
            "Quarantined nodes",
            "node",
            "pool",
            "owned by",
            "state",
            "for",
            "why",
            "evicted",
            "notes",
            short=("state", "for"),
        )
        for n in view.quarantined:
            why = Text("\n").join(_problem(p) for p in n.problems) if n.problems else Text(n.reason)
            q.add_row(
                n.name,
                n.pool,
                _owned_by(n),
                n.state,
                duration(n.quarantined_for_seconds),
                why,
                "\n".join(n.evicted) or "-",
                _notes(n),
            )
        parts.append(q)
    else:
        parts.append(Text("No quarantined nodes.", style="green"))
    if view.drains:
        d = _table("Drains in progress", "node", "for", "GPU pods left", "blocked by", short=("for",))
        for dr in view.drains:
            blocked = "\n".join(f"{b.pod} (PDB {', '.join(b.pdbs) or '?'})" for b in dr.blockers) or "-"
            d.add_row(dr.node, duration(dr.running_for_seconds), str(dr.gpu_pods_left), blocked)
        parts.append(d)
    if view.refusals:
        r = _table("Decisions not carried out", "about", "reason", "when", "message")
        for x in view.refusals:
            r.add_row(x.about, x.reason, x.at or "?", x.message)
        parts.append(r)
    gpus = sum(p.gpus for p in view.pending)
    parts.append(Text(f"Pending GPU pods: {len(view.pending)} asking for {gpus} GPU(s)", style="bold"))
    if view.pending:
        pend = _table("", "pod", "GPUs", "pending for")
        for pod in view.pending[:10]:
            pend.add_row(pod.pod, str(pod.gpus), duration(pod.pending_for_seconds))
        parts.append(pend)
    if view.scaling:
        s = _table(
            "Node pools' /scale targets", "pool", "target", "replicas", "autoscaler", short=("replicas",)
        )
        for plan in view.scaling:
            s.add_row(plan.pool or "(not a gpumon pool)", plan.target, _replicas(plan), _plan(plan))
        parts.append(s)
    parts += [Text(f"could not read {p}", style="yellow") for p in view.problems]
    return Group(*parts)


def explanation(view: Explanation) -> RenderableType:
    n = view.node
    head = Text(f"node {n.name}", style="bold")
    head.append(f"  pool {n.pool}, {n.gpus} GPU(s), {'Ready' if n.ready else 'NotReady'}")
    head.append(f", owned by {_owned_by(n)}")
    if n.quarantined_at is not None:
        head.append(
            f", quarantined {duration(n.quarantined_for_seconds)} ago ({n.quarantined_at})", style="bold red"
        )
        head.append(f", state {n.state or '?'}, taint {n.taint or 'none'}")
    else:
        head.append(", not quarantined", style="green")
    notes = _notes(n)
    if notes:
        head.append(f", {notes}")
    parts: list[RenderableType] = [head, controller_line(view.controller)]
    if view.condition is not None:
        c = view.condition
        parts.append(Text(f"condition GpuUnhealthy={c.status} {c.reason} since {c.since}: {c.message}"))
    if n.problems:
        fired = _table("Rules that fired", "GPU", "reason", "severity", "rules", "first seen", "evidence")
        for p in n.problems:
            fired.add_row(
                "node" if p.index is None else f"{p.index} {p.uuid}",
                p.reason,
                Text(p.severity, style=_SEVERITY_STYLE.get(p.severity, "")),
                ", ".join(p.rules),
                p.first_seen,
                p.evidence,
            )
        parts.append(fired)
    if view.signals:
        sig = _table(
            f"Latest signals ({view.signals_source})", "GPU", "health", "why", "temp °C", "ECC unc.", "Xids"
        )
        for g in view.signals:
            health = "lost" if g.lost else g.health
            sig.add_row(
                f"{g.index} {g.uuid}",
                Text(health, style=_SEVERITY_STYLE.get(health, "green")),
                "\n".join(g.reasons),
                "" if g.temperature_celsius is None else f"{g.temperature_celsius:.0f}",
                "" if g.ecc_uncorrected is None else str(g.ecc_uncorrected),
                ", ".join(f"{x}×{k}" for k, x in sorted(g.xids.items())),
            )
        parts.append(sig)
    else:
        parts.append(Text(f"Latest signals: not available ({view.signals_error})", style="dim"))
    if view.timeline:
        tl = _table("What the controller did", "when", "event", "about", "message")
        for e in view.timeline:
            tl.add_row(e.at or "?", Text(e.reason, style="yellow" if e.warning else ""), e.about, e.message)
        parts.append(tl)
    else:
        parts.append(
            Text("No Events from the controller about this node (Events expire after an hour).", style="dim")
        )
    if view.blockers:
        bl = _table("Evictions blocked", "pod", "PDBs", "the controller's last word")
        for b in view.blockers:
            bl.add_row(b.pod, ", ".join(b.pdbs) or "?", b.message)
        parts.append(bl)
    if view.repair is not None:
        parts.append(_repair(view.repair))
    if view.refused:
        parts.append(Text("Holding it back now:", style="bold"))
        parts += [Text(f"  - {line}") for line in view.refused]
    parts.append(Text("What would lift the quarantine:", style="bold"))
    parts += [Text(f"  - {line}") for line in view.lift]
    parts += [Text(f"could not read {p}", style="yellow") for p in view.problems]
    return Group(*parts)


def _repair(ladder: RepairLadder) -> RenderableType:
    tried = _table("Repair ladder", "#", "step", "GPUs", "started", "outcome", "ended", "why")
    for s in ladder.steps:
        style = "green" if s.outcome == "succeeded" else "yellow" if s.outcome == "running" else "red"
        tried.add_row(
            str(s.attempt),
            s.step,
            "\n".join(s.gpus) or "node",
            s.started,
            Text(s.outcome, style=style),
            s.ended or "",
            s.detail,
        )
    lines: list[RenderableType] = [tried] if ladder.steps else []
    if ladder.gave_up_at is not None:
        lines.append(Text(f"gave up at {ladder.gave_up_at}", style="bold red"))
    if ladder.validated_at is not None:
        lines.append(Text(f"validated at {ladder.validated_at}", style="green"))
    lines.append(Text(f"next: {ladder.next}"))
    return Group(*lines)


def _amount(allocated: float | int, total: float | int | None) -> str:
    return f"{allocated:g}/{total:g}" if total is not None else f"{allocated:g}/?"


def _holder(h: Holder) -> Text:
    t = Text(h.pod, style="cyan")
    given = []
    if h.memory_gib is not None:
        given.append(f"{h.memory_gib:g} GiB")
    if h.core_percent is not None:
        given.append(f"{h.core_percent}%")
    if h.gpus:
        given.append(f"{h.gpus} x {h.mig_profile}" if h.mig_profile else f"{h.gpus} GPU")
    t.append(f" {h.scheme}" + (f" {' '.join(given)}" if given else ""))
    if h.used_memory_gib is not None or h.utilization_percent is not None:
        used = "?" if h.used_memory_gib is None else f"{h.used_memory_gib:g} GiB"
        sm = "?" if h.utilization_percent is None else f"{h.utilization_percent:g}%"
        t.append(f" (uses {used}, SM {sm})", style="dim")
    for flag in h.flags:
        t.append(f" {flag}", style="yellow" if flag == "idle" else "bold red")
    return t


def _card_row(c: CardAllocation) -> list[RenderableType]:
    used = "" if c.memory_used_gib is None else f"{c.memory_used_gib:g}"
    sm = "" if c.utilization_percent is None else f"{c.utilization_percent:g}"
    holders = Text("\n").join(_holder(h) for h in c.holders) if c.holders else Text("-", style="dim")
    return [
        "?" if c.index is None else str(c.index),
        c.uuid or "",
        _amount(c.memory_allocated_gib, c.memory_total_gib),
        _amount(c.core_allocated_percent, 100),
        used,
        sm,
        holders,
        Text(" ".join(c.flags), style="bold red"),
    ]


def _node_allocation(n: NodeAllocation) -> RenderableType:
    t = _table(
        f"{n.name} ({', '.join(n.schemes) or 'no shares'})",
        "GPU",
        "UUID",
        "memory GiB",
        "core %",
        "used GiB",
        "SM %",
        "pods",
        "flags",
        short=("GPU", "memory GiB", "core %", "used GiB", "SM %"),
    )
    for c in n.cards:
        t.add_row(*_card_row(c))
    notes: list[RenderableType] = [t]
    if n.devices:
        notes.append(
            Text(
                "devices allocated: "
                + ", ".join(f"{r} {used}/{total}" for r, (used, total) in n.devices.items())
            )
        )
    if n.unplaced:
        line = Text("card not known (no exporter answer, or not placed yet): ")
        notes.append(line + Text("; ").join(_holder(h) for h in n.unplaced))
    if n.usage_error:
        notes.append(
            Text(
                f"usage: not available from {n.usage_source or 'the exporter'}: {n.usage_error}", style="dim"
            )
        )
    return Group(*notes)


def allocation(view: AllocationView) -> RenderableType:
    parts: list[RenderableType] = [Text(f"GPU allocation at {view.taken_at}", style="bold")]
    parts += [_node_allocation(n) for n in view.nodes]
    if not view.nodes:
        parts.append(Text("no GPU nodes", style="dim"))
    parts += [Text(f"not read: {p}", style="yellow") for p in view.problems]
    return Group(*parts)

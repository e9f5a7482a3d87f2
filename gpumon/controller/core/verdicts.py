"""What policy concludes about each GPU and node: frozen values, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpumon.controller.core.contract.node import GpuRecord
from gpumon.gpu.health import Severity


def worst(severities: tuple[Severity | None, ...] | list[Severity | None]) -> Severity | None:
    found = [s for s in severities if s is not None]
    return max(found, key=lambda s: s.rank) if found else None


class SignalStatus(enum.StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule firing on one GPU (or on the whole node)."""

    rule: str
    severity: Severity
    reason: str  # the condition reason: XidFatal, EccUncorrectable, Thermal, ...
    evidence: str  # what was seen, for people: "Xid 79", "temperature 97 C >= 95 for 60s"
    action: str  # recommended action, for the condition message
    since: float  # firing since
    first_bad_at: float  # when the condition was first observed (start of its `for`)


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    uuid: str
    index: int
    findings: tuple[Finding, ...]  # worst first
    # Every firing rule's condition is currently false: waiting out recover_after.
    recovering: bool = False
    # Fired too often within the flap window: recovery is held back.
    flapping: bool = False

    @property
    def severity(self) -> Severity | None:
        return self.findings[0].severity if self.findings else None

    @property
    def first_bad_at(self) -> float | None:
        return min((f.first_bad_at for f in self.findings), default=None)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    signals: SignalStatus
    # Signal age in seconds at evaluation (None when missing).
    age_seconds: float | None
    # GPUs with at least one firing rule (healthy GPUs are left out).
    gpus: tuple[GpuVerdict, ...] = ()
    # Node-scoped rules firing: the whole node is affected.
    node_findings: tuple[Finding, ...] = ()
    node_recovering: bool = False

    @property
    def severity(self) -> Severity | None:
        return worst([g.severity for g in self.gpus] + [f.severity for f in self.node_findings])

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Every finding, worst first."""
        all_ = [*self.node_findings, *(f for g in self.gpus for f in g.findings)]
        return tuple(sorted(all_, key=lambda f: -f.severity.rank))

    @property
    def whole_node(self) -> bool:
        return bool(self.node_findings)

    @property
    def recovering(self) -> bool:
        """Every firing rule on the node is waiting out its hysteresis."""
        if self.severity is None:
            return False
        gpus_ok = all(g.recovering for g in self.gpus)
        return gpus_ok and (self.node_recovering or not self.node_findings)

    @property
    def first_bad_at(self) -> float | None:
        return min((f.first_bad_at for f in self.findings), default=None)


def records_of(verdict: NodeVerdict) -> tuple[GpuRecord, ...]:
    """The annotation's entries for a verdict: node-scoped first, then GPUs by index."""
    out: list[GpuRecord] = []
    groups: list[tuple[str, int | None, tuple[Finding, ...]]] = []
    if verdict.node_findings:
        groups.append(("", None, verdict.node_findings))
    groups += [(g.uuid, g.index, g.findings) for g in sorted(verdict.gpus, key=lambda g: g.index)]
    for uuid, index, findings in groups:
        top = findings[0]
        out.append(
            GpuRecord(
                uuid=uuid,
                index=index,
                reason=top.reason,
                severity=top.severity,
                rules=tuple(f.rule for f in findings),
                first_seen=min(f.first_bad_at for f in findings),
                evidence="; ".join(dict.fromkeys(f.evidence for f in findings if f.evidence)),
            )
        )
    return tuple(out)

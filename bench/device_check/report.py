"""What each step of the device check found, and the summary written from it: ``summary.json``
for a machine, ``summary.md`` for a person, and ``report.tar.gz`` with every file the steps kept
(nvidia-smi's XML, scrapes, logs, doctor's output), so a run's whole evidence is three files."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Step:
    """One numbered step of docs/nvml.md's device check: the checks it ran, what it could not run
    and why, and its figures."""

    key: str
    title: str
    checks: list[Check] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return ok

    def skip(self, what: str, why: str) -> None:
        self.skipped.append((what, why))

    @property
    def status(self) -> str:
        if self.error or any(not c.ok for c in self.checks):
            return "failed"
        if not self.checks and self.skipped:
            return "skipped"
        return "passed"


def summary(mode: str, seconds: float, steps: list[Step], facts: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "mode": mode,
        "seconds": round(seconds, 1),
        "passed": all(s.status != "failed" for s in steps),
        "facts": dict(facts),
        "steps": [asdict(s) | {"status": s.status} for s in steps],
        "skipped": [[s.key, what, why] for s in steps for what, why in s.skipped],
    }


def markdown(doc: Mapping[str, Any]) -> str:
    lines = [
        f"# gpumon device check ({doc['mode']}): {'passed' if doc['passed'] else 'FAILED'}",
        "",
        f"{doc['seconds']:.0f} s. " + "; ".join(f"{k}: {v}" for k, v in doc["facts"].items()),
        "",
    ]
    for s in doc["steps"]:
        lines += [f"## {s['title']}: {s['status']} ({s['seconds']:.0f} s)", ""]
        if s["error"]:
            lines += [f"error: {s['error']}", ""]
        for c in s["checks"]:
            detail = f" ({c['detail']})" if c["detail"] else ""
            lines.append(f"- {'ok' if c['ok'] else 'FAILED'}: {c['name']}{detail}")
        lines += [f"- skipped: {what}: {why}" for what, why in s["skipped"]]
        if s["figures"]:
            lines += ["", "```json", json.dumps(s["figures"], indent=1, sort_keys=True), "```"]
        lines.append("")
    return "\n".join(lines)


def write(out: Path, work: Path, doc: Mapping[str, Any]) -> None:
    (out / "summary.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    (out / "summary.md").write_text(markdown(doc))
    with tarfile.open(out / "report.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="report")

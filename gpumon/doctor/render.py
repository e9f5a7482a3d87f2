"""Doctor's results for people (a rich table) and for machines (JSON)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpumon.doctor.result import CheckResult, Status, counts, exit_code

_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def table(results: Sequence[CheckResult]) -> Table:
    """One row per check: its status, its family and name, then what was found with the fix
    below it (a fourth column would leave each too narrow on an 80-column terminal)."""
    t = Table(title="gpumon doctor", show_lines=True, expand=True)
    t.add_column("status", no_wrap=True)
    t.add_column("check", no_wrap=True)
    t.add_column("found / fix", ratio=1, overflow="fold")
    for r in results:
        found = Text(r.found)
        for line in r.details:
            found.append("\n  " + line, style="dim")
        if r.fix:
            found.append("\nfix: ", style="bold cyan")
            found.append(r.fix, style="cyan")
        t.add_row(Text(r.status.value, style=_STYLE[r.status]), f"{r.family}\n{r.name}", found)
    return t


def summary_line(results: Sequence[CheckResult]) -> Text:
    n = counts(results)
    worst = max((r.status for r in results), key=lambda s: s.exit_code, default=Status.OK)
    return Text(
        f"{n['ok']} ok, {n['warn']} warn, {n['fail']} fail (exit code {exit_code(results)})",
        style=_STYLE[worst],
    )


def print_table(results: Sequence[CheckResult], console: Console) -> None:
    console.print(table(results))
    console.print(summary_line(results))


def as_json(results: Sequence[CheckResult]) -> dict[str, Any]:
    return {
        "checks": [
            {
                "family": r.family,
                "name": r.name,
                "status": r.status.value,
                "found": r.found,
                "fix": r.fix,
                "details": list(r.details),
                "seconds": None if r.seconds is None else round(r.seconds, 3),
            }
            for r in results
        ],
        "summary": counts(results),
        "exit_code": exit_code(results),
    }


def dumps(results: Sequence[CheckResult]) -> str:
    return json.dumps(as_json(results), indent=2)

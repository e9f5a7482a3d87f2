"""Results -> bench/RESULTS.md (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    target: str
    measured: str
    naive: str = "—"
    ratio: str = "—"
    met: str = "—"


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    method: str
    rows: tuple[Row, ...]
    baseline: str = "naive"  # what gpumon is compared with: the column's name


@dataclass(frozen=True, slots=True)
class Grid:
    """A table with columns of its own (a Table's are fixed: figure, target, gpumon, ...)."""

    title: str
    method: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


_HEADER = ("figure", "target", "gpumon", "naive", "ratio", "target met")


def _cells(values: Sequence[str]) -> str:
    return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"


def table_markdown(table: Table | Grid) -> str:
    if isinstance(table, Table):
        table = Grid(
            table.title,
            table.method,
            (*_HEADER[:3], table.baseline, *_HEADER[4:]),
            tuple((r.figure, r.target, r.measured, r.naive, r.ratio, r.met) for r in table.rows),
        )
    lines = [
        f"## {table.title}",
        "",
        table.method,
        "",
        _cells(table.header),
        _cells(["---"] * len(table.header)),
    ]
    lines += [_cells(r) for r in table.rows]
    return "\n".join(lines)


def results_markdown(
    *, intro: str, machine: Sequence[tuple[str, str]], tables: Sequence[Table], notes: Sequence[str]
) -> str:
    parts = [
        "# gpumon benchmark results",
        "",
        intro,
        "",
        *machine_markdown(machine),
    ]
    for table in tables:
        parts += ["", table_markdown(table)]
    parts += ["", "## Method and noise", "", *(f"- {n}" for n in notes)]
    return "\n".join(parts) + "\n"


def machine_markdown(machine: Sequence[tuple[str, str]]) -> list[str]:
    return ["| machine | |", "| --- | --- |", *(_cells(pair) for pair in machine)]


# A section that one command owns inside RESULTS.md, between these two lines; the other
# commands leave it as it is.
def _begin(name: str) -> str:
    return f"<!-- begin {name} -->"


def _end(name: str) -> str:
    return f"<!-- end {name} -->"


def section_markdown(
    name: str,
    *,
    title: str,
    intro: str,
    machine: Sequence[tuple[str, str]],
    tables: Sequence[Table | Grid],
    notes: Sequence[str],
) -> str:
    """A marked section (see :func:`splice`): its own title, machine table, tables and notes."""
    parts = [_begin(name), f"## {title}", "", intro, "", *machine_markdown(machine)]
    for table in tables:
        parts += ["", table_markdown(table)]
    parts += ["", f"## {title}: method and noise", "", *(f"- {n}" for n in notes), _end(name)]
    return "\n".join(parts)


def sections(document: str) -> dict[str, str]:
    """The marked sections of ``document``, by name, markers included."""
    found = {}
    for line in document.splitlines():
        if line.startswith("<!-- begin ") and line.endswith(" -->"):
            name = line.removeprefix("<!-- begin ").removesuffix(" -->")
            start = document.find(line)
            end = document.find(_end(name), start)
            if end >= 0:
                found[name] = document[start : end + len(_end(name))]
    return found


def splice(document: str, section: str) -> str:
    """``document`` with its copy of the marked ``section`` replaced, or with it appended."""
    name = section.splitlines()[0].removeprefix("<!-- begin ").removesuffix(" -->")
    old = sections(document).get(name)
    if old is not None:
        return document.replace(old, section)
    return document.rstrip("\n") + "\n\n" + section + "\n"


def carry_sections(old: str, new: str) -> str:
    """``new`` with every marked section of ``old`` kept: rewriting one part of RESULTS.md
    does not lose the parts other commands wrote."""
    for section in sections(old).values():
        new = splice(new, section)
    return new


def side_by_side(head: str, labels: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]]) -> str:
    """A Markdown table of figures (rows) for several runs (columns), under a line ``head``."""
    lines = [head, "", "| figure | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(lines)

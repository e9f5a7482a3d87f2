"""Code and docs cite only files in the repository (docs/decisions.md, habit 16).

The design notes the project started from live outside the repository; a comment or a page that
names them as the authority sends a reader to a file they do not have, so the repository's own
pages (docs/architecture.md first) hold what those notes said. The one path outside the checkout
that may be named is the mock NVML's source folder, which hack/build-tools.sh reads as a build
input (``GPUMON_MOCKNVML_SRC`` overrides it); a file inside that folder is a document again."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()

# The notes' names as words: upper case, so "design" and "style" in prose pass.
NOTES = re.compile(r"\b(?:DESIGN|STYLE|FACTS)\b")
# ../shared (and ../../shared from hack/) except the mock NVML's source folder itself.
OUTSIDE = re.compile(r"\.\./shared(?!/mocknvml(?![\w./-]))")


def repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore, without shared/ (a checkout of the notes
    themselves, where one is present)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = (REPO / name for name in sorted(set(listed.split("\0"))) if name)
    return [p for p in paths if p.is_file() and p.parts[len(REPO.parts)] != "shared" and p != THIS]


def citations(text: str) -> list[str]:
    """Each line of ``text`` that names a note or a path outside the repository."""
    return [
        f"{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if NOTES.search(line) or OUTSIDE.search(line)
    ]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = {}
    for path in repository_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue
        lines = citations(data.decode("utf-8", errors="replace"))
        if lines:
            found[str(path.relative_to(REPO))] = lines
    assert not found, f"cite the repository's own docs instead: {found}"


@pytest.mark.parametrize(
    "line",
    [
        'DESIGN.md\'s "Node health contract" is the authority',
        "restarted with backoff (STYLE habit 12).",
        "a proxy whose CA only the host trusts (FACTS.md).",
        "the DESIGN CPU target",
        "(`../shared/FACTS.md`)",
        "no MIG instance (../shared/mocknvml/README.md)",
        "(../shared's copy has upstream fixes applied)",
        "copies the notes from ../shared first",
    ],
)
def test_a_citation_is_found(line: str) -> None:
    assert citations(f"first line\n{line}\n") == [f"2: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        "built from `../shared/mocknvml` by `make setup`",
        'MOCKNVML_SRC="${GPUMON_MOCKNVML_SRC:-$HERE/../../shared/mocknvml}"',
        "the commit ../shared/mocknvml holds.",
        "the design of the exporter, in the project's own style",
        "STYLESHEET and FACTSHEET are other words",
        "see docs/architecture.md and ../bench/RESULTS.md",
    ],
)
def test_what_is_no_citation_passes(line: str) -> None:
    assert citations(line) == []

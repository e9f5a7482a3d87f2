"""No log call in gpumon/ passes an ``extra`` key that a LogRecord already has: logging raises
KeyError for one ("Attempt to overwrite 'name' in LogRecord") at the moment the line is logged,
so the task that logs it dies, and only at the levels where that line is emitted. The repair
loop's "replacement asked" line once did this with ``name`` at INFO, the controller's default."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from gpumon.runtime.logs import _STANDARD_ATTRS

PACKAGE = Path(__file__).resolve().parents[2] / "gpumon"


def reserved_extra_keys(root: Path) -> list[str]:
    """``path:line key`` for every literal ``extra={...}`` key under ``root`` that a LogRecord
    reserves."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg != "extra" or not isinstance(kw.value, ast.Dict):
                    continue
                for key in kw.value.keys:
                    if isinstance(key, ast.Constant) and key.value in _STANDARD_ATTRS:
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno} {key.value}")
    return found


def test_no_log_call_passes_a_reserved_extra_key() -> None:
    assert reserved_extra_keys(PACKAGE) == []


def test_the_walk_finds_a_reserved_key(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        'log.info("x", extra={"node": n})\nlog.info("y", extra={"name": n, "module": m})\n'
    )
    assert reserved_extra_keys(package) == ["pkg/a.py:2 name", "pkg/a.py:2 module"]


def test_a_reserved_key_is_what_logging_refuses() -> None:
    with pytest.raises(KeyError, match="overwrite 'name'"):
        logging.getLogger("gpumon.test").makeRecord(
            "n", logging.INFO, "f", 1, "m", (), None, extra={"name": 1}
        )

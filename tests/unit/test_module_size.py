"""No module in gpumon/ is over 700 lines (docs/architecture.md): past that a file holds more
than one job. Generated protobuf modules are not ours to size."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpumon"
MAX_LINES = 700


def oversized(root: Path) -> dict[str, int]:
    sizes = {
        str(path.relative_to(root.parent)): len(path.read_text().splitlines())
        for path in sorted(root.rglob("*.py"))
        if "_pb2" not in path.name
    }
    return {path: n for path, n in sizes.items() if n > MAX_LINES}


def test_no_module_is_over_700_lines() -> None:
    assert oversized(PACKAGE) == {}


def test_the_count_finds_a_long_module(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "api_pb2.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(package) == {"pkg/long.py": MAX_LINES + 1}

"""Every class in gpumon/ has a name of its own (docs/decisions.md), so a name in a traceback, a
log line or a review points at one thing. Generated protobuf modules are not ours to name."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpumon"


def class_definitions(root: Path) -> dict[str, list[str]]:
    """Class name -> every place (path:line) a class of that name is defined under ``root``."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return where


def test_no_two_classes_in_the_package_share_a_name() -> None:
    twins = {name: places for name, places in class_definitions(PACKAGE).items() if len(places) > 1}
    assert not twins, f"class names defined more than once: {twins}"


def test_the_walk_finds_a_twin(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "a.py").write_text("class Status:\n    pass\n")
    (package / "inner" / "b.py").write_text("def f():\n    class Status:\n        pass\n")
    (package / "api_pb2.py").write_text("class Other:\n    pass\n")
    (package / "c_pb2.py").write_text("class Status:\n    pass\n")
    assert class_definitions(package)["Status"] == ["pkg/a.py:1", "pkg/inner/b.py:2"]

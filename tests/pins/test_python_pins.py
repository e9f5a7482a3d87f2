"""Python dependencies carry lower and upper bounds, so a release elsewhere cannot change a build."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
REQUIREMENTS = [
    *PYPROJECT["build-system"]["requires"],
    *PYPROJECT["project"]["dependencies"],
    *(r for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra),
]


@pytest.mark.parametrize("requirement", REQUIREMENTS)
def test_requirement_is_bounded_both_ways(requirement: str) -> None:
    specifiers = re.sub(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?", "", requirement)
    if "==" in specifiers:
        return
    assert ">=" in specifiers, f"{requirement}: no lower bound"
    assert re.search(r"<(?!=)|<=", specifiers), f"{requirement}: no upper bound"

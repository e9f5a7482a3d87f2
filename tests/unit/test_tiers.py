"""Every folder of tests is a tier that a full run collects: a folder pytest skips by name
(its default ``norecursedirs`` holds ``build``, ``dist``, ``venv`` …) would pass CI silently."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest
from tiers import TIERS

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p.parent.name for p in TESTS.glob("*/test_*.py"))


@pytest.mark.parametrize("folder", sorted(set(FOLDERS)))
def test_folder_is_a_tier_pytest_collects(folder: str, pytestconfig: pytest.Config) -> None:
    assert folder in TIERS, f"tests/{folder} has tests but is no tier in tests/conftest.py"
    skipped_by = [p for p in pytestconfig.getini("norecursedirs") if fnmatch(folder, p)]
    assert not skipped_by, f"pytest does not collect tests/{folder}: it matches norecursedirs {skipped_by}"

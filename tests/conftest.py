"""Test tiers by folder: tests/unit -> `unit`, tests/fuzz -> `fuzz`, tests/pins -> `pins`,
tests/nvml -> `nvml`, tests/prometheus -> `prometheus`, tests/cluster -> `cluster`, tests/e2e ->
`e2e`, tests/image -> `image`. Run one tier with `-m NAME`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import TIERS

pytest_plugins = ["devcluster_fixtures", "api_stand_in", "capi_pools"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            tier = Path(item.fspath).relative_to(root).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))

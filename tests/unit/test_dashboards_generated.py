"""The committed dashboard JSON is what the generator writes, and every dashboard follows the
house rules: a unit on every panel, the shared template variables, the data source variable."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
JSON_DIR = REPO / "dashboards" / "json"
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval", "__all"}
REQUIRED_VARIABLES = {"datasource", "cluster", "node", "gpu", "namespace"}


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dashboards", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _variables_used(text: str) -> set[str]:
    return set(re.findall(r"\$\{?(\w+)", text)) - GRAFANA_BUILTINS


def test_regenerating_changes_nothing() -> None:
    result = _generate("--check")
    assert result.returncode == 0, result.stderr


def test_check_fails_on_a_stale_or_stray_file(tmp_path: Path) -> None:
    assert _generate("--out", str(tmp_path)).returncode == 0
    first = sorted(tmp_path.glob("*.json"))[0]
    first.write_text(first.read_text().replace('"gpumon"', '"edited by hand"', 1))
    (tmp_path / "stray.json").write_text("{}")
    result = _generate("--out", str(tmp_path), "--check")
    assert result.returncode == 1
    assert first.name in result.stderr and "stray.json" in result.stderr


def test_the_four_dashboards_exist_with_their_uids() -> None:
    found = {name: d["uid"] for name, d in _dashboards().items()}
    assert {f"{uid}.json": uid for uid in found.values()} == found
    assert {"gpumon-fleet", "gpumon-node", "gpumon-workloads", "gpumon-controller"} <= set(found.values())


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_every_panel_has_a_unit_a_description_and_the_datasource_variable(name: str) -> None:
    d = _dashboards()[name]
    assert _panels(d)
    for p in _panels(d):
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']!r} has no unit"
        assert p.get("description"), f"{p['title']!r} has no description"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']!r} has no query"
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids), p["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("name", sorted(p.name for p in JSON_DIR.glob("*.json")))
def test_every_variable_is_defined_used_and_narrowed_by_the_ones_before(name: str) -> None:
    d = _dashboards()[name]
    variables = d["templating"]["list"]
    assert variables[0]["type"] == "datasource" and variables[0]["name"] == "datasource"
    defined = [v["name"] for v in variables]
    queries = " ".join(t["expr"] for p in _panels(d) for t in p["targets"])
    assert _variables_used(queries) <= set(defined), f"{name} uses undefined variables"
    for i, v in enumerate(variables[1:], start=1):
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        assert f'{v["name"]}=~"${v["name"]}"' in queries, f"{name}: ${v['name']} narrows no panel"
        assert v["includeAll"] and v["allValue"] == ".*" and v["multi"]
        # Each query variable is narrowed by every query variable defined before it.
        assert _variables_used(v["query"]) == set(defined[1:i]), v["name"]


def test_the_dashboards_together_offer_every_required_variable() -> None:
    offered = {v["name"] for d in _dashboards().values() for v in d["templating"]["list"]}
    assert offered >= REQUIRED_VARIABLES
    by_uid = {d["uid"]: {v["name"] for v in d["templating"]["list"]} for d in _dashboards().values()}
    assert {"node", "gpu"} <= by_uid["gpumon-node"]
    assert "namespace" in by_uid["gpumon-workloads"]

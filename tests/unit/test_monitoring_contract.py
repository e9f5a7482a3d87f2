"""Every gpumon metric the alerts, dashboards, adapter rules and autoscaling examples read is
one the code exports: names live in the exporter and controller code, and everything else
follows them. Names the monitoring already uses but the controller does not export yet are
listed in PROPOSED (docs/dashboards.md); the list must shrink as they land."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bgpumon_[a-z0-9_]+\b")
SUFFIXES = ("_total", "_bucket", "_sum", "_count")

# Read by alerts and dashboards before the code exports them: none left today.
PROPOSED: set[str] = set()


def _defined() -> set[str]:
    """Every gpumon_* string literal in the package: metric families are named there once."""
    names: set[str] = set()
    for path in (REPO / "gpumon").rglob("*.py"):
        for literal in re.findall(r"[\"'](gpumon_[a-z0-9_]+)[\"']", path.read_text()):
            names.add(literal)
    return names


def _queries() -> dict[str, str]:
    """Where each PromQL text comes from -> the text."""
    out: dict[str, str] = {}
    for group in yaml.safe_load((REPO / "alerts" / "gpumon.rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            out[f"alert {rule['alert']}"] = rule["expr"]
    for path in sorted((REPO / "dashboards" / "json").glob("*.json")):
        d = json.loads(path.read_text())
        for panel in d["panels"]:
            for target in panel.get("targets", []):
                out[f"{path.name}: {panel['title']} {target['refId']}"] = target["expr"]
        for v in d["templating"]["list"]:
            out[f"{path.name}: ${v['name']}"] = str(v.get("query", ""))
    adapter = yaml.safe_load((REPO / "deploy" / "prometheus-adapter" / "config.yaml").read_text())
    for rule in adapter["rules"] + adapter["externalRules"]:
        out[f"adapter {rule['name']['as']}"] = rule["seriesQuery"]
    for path in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        out[f"example {path.name}"] = path.read_text()
    return out


def _family(name: str, defined: set[str]) -> str:
    if name in defined:
        return name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in defined:
            return name.removesuffix(suffix)
    return name


def test_every_metric_read_is_exported_or_proposed() -> None:
    defined = _defined()
    unknown = {
        (where, name)
        for where, text in _queries().items()
        for name in NAME.findall(text)
        if _family(name, defined) not in defined
        and name not in PROPOSED
        # Names the adapter rules publish to the HPA are API names, not series; a name ending
        # in "_" is the prefix of a regex (__name__=~"gpumon_pod_gpu_.+").
        and not name.startswith("gpumon_workload_")
        and not name.endswith("_")
    }
    assert unknown == set(), "metrics read but exported nowhere in gpumon/"


def test_proposed_names_are_still_missing_and_still_used() -> None:
    landed = PROPOSED & _defined()
    assert landed == set(), f"now exported by gpumon/, remove from PROPOSED: {landed}"
    used = {name for text in _queries().values() for name in NAME.findall(text)}
    assert used >= PROPOSED

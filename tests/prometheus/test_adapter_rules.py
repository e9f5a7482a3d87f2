"""prometheus-adapter rules (deploy/prometheus-adapter/config.yaml) and the autoscaling examples
(deploy/examples/), run against a real Prometheus scraping simulated exporters.

Each rule's ``seriesQuery`` goes through ``/api/v1/series`` as the adapter's discovery does, and
its ``metricsQuery`` is filled in as prometheus-adapter fills it (pkg/naming/metrics_query.go:
``LabelMatchers`` is the selector's matchers then the namespace, joined by commas; ``GroupBy``
is the resource label for custom metrics and empty for external ones) and must return the
series the HPA would read, with the values computed here from the raw series.

The simulated exporters' pods come from a real pod-resources endpoint without the API server,
so no process is attributed to them: their values are 0, and the checks are about which series
each filled-in query selects and how it aggregates them.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
import yaml
from conftest import PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
ADAPTER = yaml.safe_load((REPO / "deploy" / "prometheus-adapter" / "config.yaml").read_text())
HPA = yaml.safe_load((REPO / "deploy" / "examples" / "hpa-gpu-utilization.yaml").read_text())
KEDA = yaml.safe_load((REPO / "deploy" / "examples" / "keda-scaledobject.yaml").read_text())
RULES = [("custom", r) for r in ADAPTER["rules"]] + [("external", r) for r in ADAPTER["externalRules"]]


def _rule_id(kind: str, rule: dict[str, Any]) -> str:
    return f"{kind}:{rule['name']['as']}"


RULE_PARAMS = [pytest.param(kind, rule, id=_rule_id(kind, rule)) for kind, rule in RULES]


def fill(template: str, *, series: str, label_matchers: str, group_by: str) -> str:
    """prometheus-adapter's Go template, for the fields our rules use."""
    out = (
        template.replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", label_matchers)
        .replace("<<.GroupBy>>", group_by)
    )
    assert "<<" not in out, f"template field this test does not fill: {out}"
    return out


def metric_name(rule: dict[str, Any], series_name: str) -> str:
    """The API metric name for a series (``name.matches`` / ``name.as``, Go's ``$1`` expansion)."""
    m = re.search(rule["name"]["matches"], series_name)
    assert m, (series_name, rule["name"])
    return re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))), rule["name"]["as"])


def _aggregate(rule: dict[str, Any]) -> Any:
    """What the rule's query does to the raw series it selects (the first PromQL aggregation)."""
    op = re.match(r"\s*(sum|avg)\b", rule["metricsQuery"])
    assert op, rule["metricsQuery"]
    return {"sum": sum, "avg": fmean}[op.group(1)]


def _at(prometheus: PrometheusProcess, expr: str, moment: float) -> list[dict[str, Any]]:
    """An instant query at a fixed moment, so raw and aggregated answers see the same samples."""
    result: list[dict[str, Any]] = prometheus.api("query", query=expr, time=f"{moment:.3f}")["result"]
    return result


def test_every_rule_is_namespaced_by_the_namespace_label() -> None:
    for kind, rule in RULES:
        overrides = rule["resources"]["overrides"]
        assert overrides["namespace"] == {"resource": "namespace"}, _rule_id(kind, rule)
        assert rule.get("resources", {}).get("namespaced", True), _rule_id(kind, rule)
        if kind == "custom":
            assert overrides["pod"] == {"resource": "pod"}
            assert "<<.GroupBy>>" in rule["metricsQuery"]


def _shape(query: str) -> tuple[str, str, frozenset[str]]:
    """(aggregation, series, matchers) of a one-selector aggregation, ignoring order and spaces."""
    m = re.fullmatch(r"\s*(\w+)\((\w+)\{(.*)\}\)\s*", query)
    assert m, query
    return m.group(1), m.group(2), frozenset(x.replace(" ", "") for x in m.group(3).split(","))


def _quantity(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def test_examples_use_the_external_rules() -> None:
    """The HPA names an external rule; KEDA's query is the one the adapter builds for that HPA."""
    external = {r["name"]["as"]: r for k, r in RULES if k == "external"}
    (metric,) = HPA["spec"]["metrics"]
    assert metric["type"] == "External"
    rule = external[metric["external"]["metric"]["name"]]
    selector = metric["external"]["metric"]["selector"]["matchLabels"]
    adapter_query = fill(
        rule["metricsQuery"],
        series=rule["seriesQuery"].split("{")[0],
        label_matchers=",".join(
            [*(f'{k}="{v}"' for k, v in selector.items()), f'namespace="{HPA["metadata"]["namespace"]}"']
        ),
        group_by="",
    )
    (trigger,) = KEDA["spec"]["triggers"]
    assert _shape(trigger["metadata"]["query"]) == _shape(adapter_query)
    assert float(trigger["metadata"]["threshold"]) == _quantity(metric["external"]["target"]["value"])
    # Both targets are means over the pods, not per-replica totals.
    assert trigger["metricType"] == "Value" and metric["external"]["target"]["type"] == "Value"


@pytest.mark.parametrize("kind, rule", RULE_PARAMS)
def test_series_query_discovers_the_metric(
    kind: str, rule: dict[str, Any], fleet_prometheus: PrometheusProcess
) -> None:
    found = fleet_prometheus.api("series", **{"match[]": rule["seriesQuery"]})
    assert found, rule["seriesQuery"]
    assert {metric_name(rule, s["__name__"]) for s in found} == {rule["name"]["as"]}


@pytest.mark.parametrize("kind, rule", [p for p in RULE_PARAMS if p.values[0] == "custom"])
def test_custom_rule_returns_one_series_per_requested_pod(
    kind: str, rule: dict[str, Any], fleet_prometheus: PrometheusProcess
) -> None:
    moment = time.time()
    raw = _at(fleet_prometheus, rule["seriesQuery"], moment)
    assert raw, rule["seriesQuery"]
    by_pod: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in raw:
        by_pod[(s["metric"]["namespace"], s["metric"]["pod"])].append(float(s["value"][1]))
    namespace = sorted(by_pod)[0][0]
    pods = sorted(p for ns, p in by_pod if ns == namespace)[:2]
    matcher = f'pod="{pods[0]}"' if len(pods) == 1 else f'pod=~"{"|".join(pods)}"'
    query = fill(
        rule["metricsQuery"],
        series=rule["seriesQuery"].split("{")[0],
        label_matchers=f'namespace="{namespace}",{matcher}',
        group_by="pod",
    )
    result = _at(fleet_prometheus, query, moment)
    assert {r["metric"]["pod"] for r in result} == set(pods), query
    aggregate = _aggregate(rule)
    for r in result:
        expected = aggregate(by_pod[(namespace, r["metric"]["pod"])])
        assert float(r["value"][1]) == pytest.approx(expected)


@pytest.mark.parametrize("kind, rule", [p for p in RULE_PARAMS if p.values[0] == "external"])
def test_external_rule_returns_one_value_for_the_hpa_selector(
    kind: str, rule: dict[str, Any], fleet_prometheus: PrometheusProcess
) -> None:
    moment = time.time()
    raw = _at(fleet_prometheus, rule["seriesQuery"], moment)
    assert raw, rule["seriesQuery"]
    by_workload: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in raw:
        by_workload[(s["metric"]["namespace"], s["metric"]["container"])].append(float(s["value"][1]))
    # The workload with the most series (the inference Deployment, on both nodes).
    namespace, container = max(sorted(by_workload), key=lambda k: len(by_workload[k]))
    assert len(by_workload[(namespace, container)]) > 1
    # The HPA's selector first, then its namespace, as BuildExternal orders them.
    matchers = f'container="{container}",namespace="{namespace}"'
    series = rule["seriesQuery"].split("{")[0]
    query = fill(rule["metricsQuery"], series=series, label_matchers=matchers, group_by="")
    (result,) = _at(fleet_prometheus, query, moment)
    # It aggregates exactly the workload's series, on every node.
    (count,) = _at(fleet_prometheus, f"count({series}{{{matchers}}})", moment)
    assert int(count["value"][1]) == len(by_workload[(namespace, container)])
    expected = _aggregate(rule)(by_workload[(namespace, container)])
    assert float(result["value"][1]) == pytest.approx(expected)


def test_keda_example_query_returns_a_value(fleet_prometheus: PrometheusProcess) -> None:
    (trigger,) = KEDA["spec"]["triggers"]
    assert len(fleet_prometheus.query(trigger["metadata"]["query"])) == 1

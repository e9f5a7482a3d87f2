"""Every query of the committed dashboards, sent to a real Prometheus as Grafana would send it,
returns data: a real Prometheus scrapes two simulated exporters (one with broken GPUs, pods on
both from a real pod-resources gRPC endpoint), and each
panel target runs through ``/api/v1/query`` or ``/api/v1/query_range`` and each template
variable through ``/api/v1/label/<name>/values`` over the last five minutes.

Grafana's side is reproduced, not mocked: variables set to "All" become their ``allValue``
(``.*``), ``$__rate_interval``/``$__interval``/``$__range`` become durations for the range
and step used. Panels that need series nothing here produces yet are listed in PENDING with the
reason; they run anyway as strict xfails, so the list cannot outlive its reason.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import FLEET_CLUSTER, ExporterProcess, PrometheusProcess, http_post_json

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = {
    p.stem: json.loads(p.read_text()) for p in sorted((REPO / "dashboards" / "json").glob("*.json"))
}

RANGE_SECONDS = 300
STEP_SECONDS = 5
# Grafana: max($__interval + scrape interval, 4 x scrape interval); scrape interval is 1 s here.
RATE_INTERVAL = f"{4 * STEP_SECONDS}s"

# metric (or prefix) -> why a query reading it cannot have data in this tier yet.
_SHARED = (
    "shared-GPU allocations come from pod annotations (gpushare, cGPU, HAMi), read from the "
    "API server, which this tier has not"
)
_CONTROLLER = (
    "the controller runs against the API server, which this tier has not; its metrics "
    "are not scraped here yet"
)
PENDING = {
    "gpumon_pod_gpu_memory_allocated_bytes": _SHARED,
    "gpumon_pod_gpu_core_allocated_ratio": _SHARED,
    "gpumon_controller_": _CONTROLLER,
    "gpumon_autoscaler_": _CONTROLLER,
}


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def pending(self) -> str | None:
        """Why this query has no data here yet: it reads a PENDING metric (for a union, `or`,
        every metric it reads must be PENDING, since one side with data is enough)."""
        reasons = [
            next((why for p, why in PENDING.items() if name.startswith(p)), None)
            for name in re.findall(r"\bgpumon_[a-z0-9_]+", self.expr)
        ]
        known = [why for why in reasons if why]
        if not known or (" or " in self.expr and len(known) < len(reasons)):
            return None
        return known[0]


def _targets() -> list[Target]:
    return [
        Target(uid, panel["title"], t["refId"], t["expr"], bool(t.get("instant")))
        for uid, d in DASHBOARDS.items()
        for panel in d["panels"]
        if panel["type"] != "row"
        for t in panel["targets"]
    ]


def _params(targets: list[Target]) -> list[Any]:
    return [
        pytest.param(
            t,
            id=f"{t.dashboard}:{t.panel}:{t.ref_id}",
            marks=[pytest.mark.xfail(reason=t.pending, strict=True)] if t.pending else [],
        )
        for t in targets
    ]


def _variables() -> list[tuple[str, dict[str, Any]]]:
    return [
        (uid, v) for uid, d in DASHBOARDS.items() for v in d["templating"]["list"] if v["type"] == "query"
    ]


def _regex_escape(value: str) -> str:
    """Grafana's escaping of a chosen value for a Prometheus regex matcher: regex metacharacters
    get a backslash, itself escaped for the PromQL string literal."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def substitute(self, expr: str, values: dict[str, str] | None = None) -> str:
        """Grafana's interpolation: variables (default "All" = their allValue) and interval macros."""
        builtins = {
            "__rate_interval": RATE_INTERVAL,
            "__interval": f"{STEP_SECONDS}s",
            "__range": f"{int(self.end - self.start)}s",
        }

        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name in builtins:
                return builtins[name]
            return _regex_escape(values[name]) if values and name in values else ".*"

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


@pytest.fixture(scope="module")
def window(fleet_prometheus: PrometheusProcess, gpu_fleet: dict[str, ExporterProcess]) -> Window:
    """The last five minutes, just after a fresh (informational) Xid arrived on gpu-node-b, so
    the Xid timeline has an event inside the range whatever ran before this module."""
    selector = 'gpumon_gpu_xid_errors_total{node="gpu-node-b", gpu="0", xid="13"}'
    before = fleet_prometheus.query(selector)
    count = float(before[0]["value"][1]) if before else 0.0
    status, answer = http_post_json(
        f"{gpu_fleet['gpu-node-b'].url}/api/v1/faults", {"gpu": 0, "fault": "xid", "code": 13}
    )
    assert status == 200, answer
    fleet_prometheus.wait_for(f"{selector} > {count}")
    end = time.time() + 1
    return Window(end - RANGE_SECONDS, end)


@pytest.mark.parametrize("target", _params(_targets()))
def test_panel_query_returns_data(
    target: Target, fleet_prometheus: PrometheusProcess, window: Window
) -> None:
    expr = window.substitute(target.expr)
    if target.instant:
        data = fleet_prometheus.api("query", query=expr, time=f"{window.end:.3f}")
    else:
        data = fleet_prometheus.api(
            "query_range",
            query=expr,
            start=f"{window.start:.3f}",
            end=f"{window.end:.3f}",
            step=str(STEP_SECONDS),
        )
    assert data["result"], f"no data for {expr}"


def _label_values(prometheus: PrometheusProcess, query: str, window: Window) -> list[str]:
    """A Grafana ``label_values(selector, label)`` variable query, as the data source sends it."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
    assert m, f"not a label_values() query: {query}"
    selector, label = m.groups()
    params = {"match[]": selector, "start": f"{window.start:.3f}", "end": f"{window.end:.3f}"}
    values: list[str] = prometheus.api(f"label/{label}/values", **params)
    return values


@pytest.mark.parametrize(
    "uid, variable",
    [pytest.param(uid, v, id=f"{uid}:${v['name']}") for uid, v in _variables()],
)
def test_variable_query_returns_values(
    uid: str, variable: dict[str, Any], fleet_prometheus: PrometheusProcess, window: Window
) -> None:
    assert _label_values(fleet_prometheus, window.substitute(variable["query"]), window)


def test_variables_narrow_each_other(fleet_prometheus: PrometheusProcess, window: Window) -> None:
    """Choosing one value of each variable in turn (as a user does) still leaves values for the
    next one, and the values are what the fleet has."""
    variables = {v["name"]: v for _, v in _variables()}
    chosen: dict[str, str] = {}
    for name in ("cluster", "node", "gpu"):
        values = _label_values(fleet_prometheus, window.substitute(variables[name]["query"], chosen), window)
        assert values, f"${name} is empty once {chosen} is chosen"
        chosen[name] = sorted(values)[0]
    assert chosen == {"cluster": FLEET_CLUSTER, "node": "gpu-node-a", "gpu": "0"}


def test_pending_list_is_honest() -> None:
    """Every PENDING entry keeps at least one query pending (the strict xfails do the rest)."""
    for name in PENDING:
        assert any(t.pending and name in t.expr for t in _targets()), name

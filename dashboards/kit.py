"""Building blocks of gpumon's dashboards: the data source, the template variables, label
selectors, and panel constructors that cannot build a panel without a unit.

Every panel queries the dashboard's ``$datasource``; every query narrows by the variables its
dashboard declares (``cluster=~"$cluster"`` ...). A variable's "All" value is ``.*``, which also
matches a series without that label: a single-cluster Prometheus with no ``cluster`` label works
unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["gpumon", "gpu"]

# ---------------------------------------------------------------------------------------------
# Template variables: each is narrowed by the ones before it.

VARIABLE_ORDER = ("cluster", "node", "gpu", "namespace")
_VARIABLE_QUERIES = {
    "cluster": "label_values(gpumon_gpu_info, cluster)",
    "node": 'label_values(gpumon_gpu_info{cluster=~"$cluster"}, node)',
    "gpu": 'label_values(gpumon_gpu_info{cluster=~"$cluster", node=~"$node"}, gpu)',
    # Any per-pod family: a pod holding a GPU it does not use has no memory or utilization series.
    "namespace": (
        'label_values({__name__=~"gpumon_pod_gpu_.+", cluster=~"$cluster", node=~"$node"}, namespace)'
    ),
}
_VARIABLE_SORT = {"gpu": model.VariableSort.NUMERICAL_ASC}
_VARIABLE_LABELS = {"cluster": "Cluster", "node": "Node", "gpu": "GPU", "namespace": "Namespace"}


def variables(*names: str) -> list[cogbuilder.Builder[model.VariableModel]]:
    """The data source variable, then the named query variables in their dependency order."""
    unknown = set(names) - set(VARIABLE_ORDER)
    if unknown:
        raise ValueError(f"unknown variables: {sorted(unknown)}")
    out: list[cogbuilder.Builder[model.VariableModel]] = [
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus")
    ]
    for name in VARIABLE_ORDER:
        if name in names:
            out.append(
                dash.QueryVariable(name)
                .label(_VARIABLE_LABELS[name])
                .datasource(DATASOURCE)
                .query(_VARIABLE_QUERIES[name])
                .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(_VARIABLE_SORT.get(name, model.VariableSort.ALPHABETICAL_ASC))
                .multi(True)
                .include_all(True)
                .all_value(".*")
                .current(model.VariableOption(selected=True, text="All", value="$__all"))
            )
    return out


def sel(*names: str, **fixed: str) -> str:
    """A label matcher list: the named variables as regex matches, then fixed matchers.

    ``sel("cluster", "node", state="lost")`` -> ``cluster=~"$cluster", node=~"$node", state="lost"``;
    a fixed value starting with ``~`` or ``!`` becomes ``=~``/``!=``/``!~`` (``"!~idle"``)."""
    parts = [f'{n}=~"${n}"' for n in names]
    for label, value in fixed.items():
        op = "="
        for prefix in ("!~", "~", "!"):
            if value.startswith(prefix):
                op = {"!~": "!~", "~": "=~", "!": "!="}[prefix]
                value = value[len(prefix) :]
                break
        parts.append(f'{label}{op}"{value}"')
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Queries and panels


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""
    # Instant queries feed stats, bar gauges and tables: one value per series, now.
    instant: bool = False
    table: bool = False


def _targets(queries: Sequence[Query]) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    out: list[cogbuilder.Builder[cogvariants.Dataquery]] = []
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        if q.legend:
            t = t.legend_format(q.legend)
        t = t.instant() if q.instant else t.range()
        if q.table:
            t = t.format(prom_model.PromQueryFormat.TABLE)
        out.append(t)
    return out


@dataclass(frozen=True, slots=True)
class Layout:
    width: int = 12
    height: int = 8


HALF = Layout()
THIRD = Layout(8, 8)
QUARTER_STAT = Layout(6, 5)
FULL = Layout(24, 9)


P = TypeVar(
    "P", timeseries.Panel, stat.Panel, table.Panel, heatmap.Panel, statetimeline.Panel, bargauge.Panel
)


def _common(panel: P, title: str, description: str, unit: str, queries: Sequence[Query], layout: Layout) -> P:
    if not unit:
        raise ValueError(f"panel {title!r} needs a unit")
    return (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(layout.width)
        .height(layout.height)
    )


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    layout: Layout = HALF,
    bars: bool = False,
    min_value: float | None = None,
    max_value: float | None = None,
) -> timeseries.Panel:
    p = _common(timeseries.Panel(), title, description, unit, queries, layout).legend(
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    if min_value is not None:
        p = p.min(min_value)
    if max_value is not None:
        p = p.max(max_value)
    return p


def stat_panel(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    layout: Layout = QUARTER_STAT,
    colors: dict[str, str] | None = None,
) -> stat.Panel:
    p = (
        _common(stat.Panel(), title, description, unit, queries, layout)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for name, color in (colors or {}).items():
        p = p.override_by_name(name, [_fixed_color(color)])
    return p


def bargauge_panel(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    layout: Layout = HALF,
    max_value: float | None = None,
) -> bargauge.Panel:
    p = (
        _common(bargauge.Panel(), title, description, unit, queries, layout)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .min(0)
    )
    return p.max(max_value) if max_value is not None else p


def table_panel(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    layout: Layout = FULL,
    hidden_columns: Sequence[str] = ("Time", "__name__", "job", "instance"),
) -> table.Panel:
    p = _common(table.Panel(), title, description, unit, queries, layout).show_header(True)
    return p.with_transformation(
        model.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": dict.fromkeys(hidden_columns, True)},
        )
    )


def heatmap_panel(
    title: str, description: str, unit: str, query: Query, layout: Layout = HALF
) -> heatmap.Panel:
    """A heatmap bucketed by Grafana from raw per-GPU series: how the fleet spreads, over time."""
    return (
        _common(heatmap.Panel(), title, description, unit, [query], layout)
        .calculate(True)
        .y_axis(
            # A calculated heatmap's y axis is the value: it carries the unit.
            heatmap.YAxisConfig().unit(unit).min(0)
        )
    )


def state_timeline_panel(
    title: str,
    description: str,
    unit: str,
    query: Query,
    states: dict[int, tuple[str, str]],
    layout: Layout = FULL,
) -> statetimeline.Panel:
    """Numbered states shown as named, coloured bands: ``states`` maps value -> (text, colour)."""
    mapping = model.ValueMap(
        options={
            str(v): model.ValueMappingResult(text=text, color=color, index=i)
            for i, (v, (text, color)) in enumerate(sorted(states.items()))
        }
    )
    return (
        _common(statetimeline.Panel(), title, description, unit, [query], layout)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .mappings([mapping])
    )


def _fixed_color(color: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})


HEALTH_COLORS = {"healthy": "green", "degraded": "yellow", "unhealthy": "orange", "lost": "red"}

# ---------------------------------------------------------------------------------------------
# Dashboards


Section = tuple[str, Sequence[cogbuilder.Builder[model.Panel]]]


def build_dashboard(
    uid: str,
    title: str,
    description: str,
    variable_names: Sequence[str],
    sections: Sequence[Section],
) -> model.Dashboard:
    d = (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .variables(variables(*variable_names))
    )
    for row_title, panels in sections:
        d = d.with_row(dash.Row(row_title))
        for panel in panels:
            d = d.with_panel(panel)
    built = d.build()
    # Panel ids must be unique within a dashboard; Grafana links to a panel by its id.
    for n, p in enumerate(built.panels or [], start=1):
        p.id_val = n
    return built


def to_json(d: model.Dashboard) -> str:
    """Stable text for the committed file: sorted keys, two-space indent, final newline."""
    return json.dumps(json.loads(json.dumps(d, cls=JSONEncoder)), indent=2, sort_keys=True) + "\n"

"""bench/fleet-65k.json -> the fleet-65k section of bench/RESULTS.md (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import Grid, section_markdown
from bench.scale_curve import least_squares

SECTION = "fleet-65k"
TITLE = "Fleet at 65,000 and 100,000 nodes (issue #29)"
TARGETS = (65_000, 100_000)
MiB = 2**20
INTERVAL_SECONDS = 10.0  # signals.interval_seconds, the default round interval
RESTART_GOAL_SECONDS = 30.0  # restart -> first correct decision, docs/benchmarks.md

INTRO = """\
What the controller's cost does at 65,000 nodes (520,000 GPUs) and 100,000 (800,000 GPUs), where
this 2-core machine cannot hold the API side (the API-facing figures are the controller scale
curve's, up to 10,000 nodes). Two parts, each measured with the real gpumon code on one generated
fleet (bench/fleet_model.py: 8 GPUs a node, 4 pools, one GPU pod per GPU, 0.3 % of the GPUs
faulted): the **pure parts** in-process (a whole policy round, the admission, the drain plans,
the scale plan), and the **signal side**: a real Prometheus TSDB holding the fleet's series
(built with `promtool tsdb create-blocks-from openmetrics`) queried by the checkout's
Prometheus source in a process of its own, each query also timed alone beside main's
fleet-wide query set (**naive**). Sizes the signal side did not run are **derived** by a
least-squares line over those it did, and say so. Regenerate with `python -m bench fleet-65k`
(about 30 minutes; bench/fleet-65k.json keeps the figures, `--render` rewrites this section
from it)."""


def _mib(v: float) -> str:
    return f"{v / MiB:,.0f} MiB"


def _s(v: float) -> str:
    return f"{v:.2f} s" if v < 100 else f"{v:.0f} s"


def _ms(v: float) -> str:
    return f"{v * 1000:.1f} ms"


def _us(v: float) -> str:
    return f"{v * 1e6:.0f} µs"


def _n(v: float) -> str:
    return f"{v:,.0f}"


def _mb(v: float) -> str:
    return f"{v / 1e6:,.1f} MB"


def pure_grid(pure: Sequence[Mapping[str, Any]]) -> Grid:
    rows = [
        (
            _n(p["nodes"]), _n(p["gpus"]), _n(p["faulted_gpus"]), _n(p["nodes_with_findings"]),
            _mib(p["state_bytes"]), _s(p["restart_cpu"]),
            _s(p["restart_summaries_cpu"]) if "restart_summaries_cpu" in p else "—",
            _s(p["resync_cpu"]), _us(p["healthy_cpu"]),
            _us(p["bad_cpu"]), _s(p["bad_cpu"] * p["nodes_with_findings"]),
            f"{_ms(p['admit_cpu'])} ({p['candidates']} → {p['admitted']})",
            f"{_ms(p['drain_cpu'])} ({p['drains']} nodes)",
            _ms(p["scale_plan_cpu"]), _ms(p["scale_inputs_cpu"]),
        )
        for p in pure
    ]  # fmt: skip
    return Grid(
        f"{TITLE}: the pure parts, in-process",
        "CPU seconds (process time, one thread) of the real functions on the generated state. "
        "Whole round: `evaluate_node` over every node, as a restart (no state held) and a resync "
        "(the states of the round before) do; a restart's again on the readings the Prometheus "
        "source gives: the nodes its answers name (a fault, or an Xid within the window) read GPU by "
        "GPU, every other one as a whole, no GPU listed. Per node: a healthy node's evaluation (from the "
        "resync round, less the nodes with findings) and a node with findings (rounds over those "
        "alone: the reconciler's steady round when only they are dirty). Admission: `admit` of the "
        "candidates (default safety policy: at most 5 new quarantines per 10 minutes). Drain: "
        "`plan_drain` for every node with an unhealthy GPU. Scale: bench/autoscale_plan.py's "
        "builders at this size (one scheduled GPU pod per GPU, 500 pending): `plan_pools`, and the "
        "shell reading its caches into its inputs. State: the Node views, readings and GPU pods as "
        "built (tracemalloc), what a round reads; the controller's caches hold more (the scale curve's "
        "RSS).",
        (
            "nodes",
            "GPUs",
            "faulted GPUs",
            "nodes with findings",
            "state",
            "whole round, restart",
            "whole round, restart, Prometheus readings",
            "whole round, resync",
            "per healthy node",
            "per node with findings",
            "round of the nodes with findings",
            "admission (candidates → admitted)",
            "drain plans",
            "scale plan (pure)",
            "scale: caches → inputs",
        ),
        tuple(rows),
    )


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: Callable[[Mapping[str, Any]], float]
    text: Callable[[float], str]
    limit: float | None = None
    limit_text: str = "—"


def _round(s: Mapping[str, Any], key: str) -> float:
    """A figure of the patient round; none (NaN, which no fit takes) where even it failed."""
    last = s["patient_round"]["rounds"][-1]
    return float(last[key]) if last["ok"] else math.nan


def _answers(queries: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(sum(q[key] for q in queries))


SIGNAL_FIGURES = (
    Figure(
        "round wall (patient timeout)", lambda s: _round(s, "wall"), _s, INTERVAL_SECONDS,
        f"the {INTERVAL_SECONDS:.0f} s round interval",
    ),
    Figure(
        "round CPU", lambda s: _round(s, "cpu"), _s, INTERVAL_SECONDS,
        f"1 core at the {INTERVAL_SECONDS:.0f} s interval",
    ),
    Figure(
        "longest query alone (checkout)", lambda s: max(q["seconds"] for q in s["checkout"]), _s, 5.0,
        "the 5 s query timeout (default)",
    ),
    Figure(
        "source process peak RSS", lambda s: _round(s, "hwm"), _mib, 2**30, "1 GiB (the controller's goal)"
    ),
    Figure("answers, checkout (bytes)", lambda s: _answers(s["checkout"], "answer_bytes"), _mb),
    Figure("answers, naive (bytes)", lambda s: _answers(s["naive"], "answer_bytes"), _mb),
    Figure("answers, checkout (samples)", lambda s: _answers(s["checkout"], "samples"), _n),
    Figure("Prometheus peak RSS", lambda s: float(s["prometheus_rss_peak"]), _mib),
    Figure("TSDB on disk", lambda s: float(s["tsdb_bytes"]), _mib),
)  # fmt: skip


def _crossing(intercept: float, slope: float, limit: float) -> str:
    if intercept >= limit:
        return "already at 0 nodes"
    if slope <= 0:
        return "never"
    return f"{(limit - intercept) / slope:,.0f} nodes"


def _outcome(r: Mapping[str, Any]) -> str:
    """A round's wall time, or that it failed (every query retried to its timeout, or one did)."""
    return _s(r["wall"]) if r["ok"] else f"**failed** after {_s(r['wall'])}"


def _query_cells(q: Mapping[str, Any] | None) -> tuple[str, str, str]:
    return ("—", "—", "—") if q is None else (_s(q["seconds"]), _n(q["samples"]), _mb(q["answer_bytes"]))


def signal_grids(signal: Sequence[Mapping[str, Any]]) -> tuple[Grid, Grid, Grid, Grid]:
    sizes = [s["signal"]["nodes"] for s in signal]
    entries = [s["signal"] for s in signal]
    measured = ", ".join(_n(n) for n in sizes)
    round_rows = []
    for s in entries:
        default = s["default_round"]["rounds"][0]
        first, last = s["patient_round"]["rounds"]
        round_rows.append(
            (
                f"{_n(s['nodes'])} (measured)", _n(s["fleet"]["nodes"] * 8), _n(s["build"]["series"]),
                _outcome(default), _outcome(last), _s(last["cpu"]), _mib(s["patient_round"]["rss_start"]),
                _mib(last["rss"]),
                _mib(last["hwm"]), f"{_n(last['changed'])} of {_n(last['nodes'])}",
                _mb(_answers(s["checkout"], "answer_bytes")), _mb(_answers(s["naive"], "answer_bytes")),
                f"{_outcome(first)}, {_s(first['cpu'])} CPU",
            )
        )  # fmt: skip
    fits = {f.name: least_squares(sizes, [f.value(s) for s in entries]) for f in SIGNAL_FIGURES}
    for target in TARGETS:
        if target in sizes:
            continue

        def at(name: str, target: int = target) -> float:
            fit = fits[name]
            return math.nan if fit is None else fit.at(target)

        round_rows.append(
            (
                f"**{_n(target)} (derived)**", _n(target * 8), "—", "—",
                _s(at("round wall (patient timeout)")),
                _s(at("round CPU")), "—", "—", _mib(at("source process peak RSS")), "—",
                _mb(at("answers, checkout (bytes)")), _mb(at("answers, naive (bytes)")), "—",
            )
        )  # fmt: skip
    rounds = Grid(
        f"{TITLE}: the controller's Prometheus round",
        "The checkout's `PrometheusSource`, built as the controller builds it from a default config "
        "(`signals.source: prometheus`), in a process of its own (bench/fleet_round.py); CPU is its "
        "utime + stime over `poll_once`, RSS from /proc. Once with the config's default query "
        "timeout (5 s, 2 retries), then with the longest the config allows (120 s) for two rounds "
        "one scrape apart (the second's figures; the first's in the last column): the nodes "
        "'changed' are those the source tells the reconciler to evaluate. Answers: the sum over the "
        "round's queries, each timed alone (next table). Derived rows: the least-squares line of "
        f"each figure over the measured sizes ({measured}).",
        (
            "nodes",
            "GPUs",
            "series",
            "round at the default timeout",
            "round wall (120 s timeout)",
            "round CPU",
            "RSS after start-up",
            "RSS after the round",
            "peak RSS",
            "nodes reported changed",
            "answers (checkout)",
            "answers (naive)",
            "first round",
        ),
        tuple(round_rows),
    )
    query_rows = []
    for s in entries:
        naive = {q["name"]: q for q in s["naive"]}
        ours = {q["name"]: q for q in s["checkout"]}
        for name in dict.fromkeys([*ours, *naive]):
            o, b = ours.get(name), naive.get(name)
            ratio = f"{b['answer_bytes'] / o['answer_bytes']:.1f}×" if o and b and o["answer_bytes"] else "—"
            query_rows.append(
                (
                    _n(s["nodes"]), f"`{name}`",
                    *_query_cells(o),
                    *_query_cells(b),
                    ratio,
                    "same" if o and b and o["promql"] == b["promql"] else "changed",
                )
            )  # fmt: skip
    queries = Grid(
        f"{TITLE}: each query alone",
        "An instant query at the data's time as the source sends it (POST), with aiohttp, one at a "
        "time, median of 3: from the request to the last byte of the JSON answer (Prometheus's "
        "evaluation, encoding and the transfer over loopback). Samples: the answer's series. The "
        "checkout's round has two steps: the first asks the whole fleet (the rows to `xid`; "
        "`__busy` only where pools are autoscaled, so the round above, from a config without "
        "pools, does not ask it), the second reads GPU by GPU the nodes the first step's answers "
        "name, 256 names a query (`[i/n]`: the chunk, where there are several). "
        "**ratio**: the naive answer's bytes over the checkout's (above 1: the checkout's is "
        "smaller). The naive set is main's before issue #29 (bench/fleet_prometheus.py, "
        "`NAIVE_QUERIES`).",
        (
            "nodes",
            "query",
            "checkout: time",
            "samples",
            "bytes",
            "naive: time",
            "samples",
            "bytes",
            "ratio (bytes)",
            "PromQL",
        ),
        tuple(query_rows),
    )
    cost_rows = tuple(
        (
            _n(s["nodes"]), _n(s["build"]["series"]), _mb(s["build"]["text_bytes"]),
            _s(s["build"]["write_seconds"]),
            f"{_s(s['build']['promtool_seconds'])} (parts: {s['build']['parts']})",
            _mib(s["build"]["promtool_peak_rss"]), _mib(s["tsdb_bytes"]), _s(s["start_seconds"]),
            _s(s["compaction_seconds"]), _mib(s["prometheus_rss_idle"]), _mib(s["prometheus_rss_peak"]),
        )
        for s in entries
    )  # fmt: skip
    cost = Grid(
        f"{TITLE}: what the method cost",
        "OpenMetrics text written by Python, one part at a time (each deleted once read); promtool "
        "wall time over all parts and the largest part's peak RSS; the TSDB's size once Prometheus "
        "merged the parts' overlapping blocks into one; Prometheus from start to ready, from ready "
        "to the parts merged (its own vertical compaction), its RSS then and its peak after every "
        "query above.",
        (
            "nodes",
            "series",
            "text",
            "writing it",
            "promtool",
            "promtool peak RSS",
            "TSDB",
            "Prometheus start",
            "merge of the parts",
            "Prometheus RSS, merged",
            "Prometheus peak RSS",
        ),
        cost_rows,
    )
    fit_rows = []
    for f in SIGNAL_FIGURES:
        fit = fits[f.name]
        if fit is None:
            continue
        residuals = ", ".join(f"{_n(n)}: {f.text(r)}" for n, r in zip(fit.sizes, fit.residuals, strict=True))
        fit_rows.append(
            (
                f.name, f.text(fit.intercept), f"{f.text(fit.slope * 1000)} per 1,000 nodes", residuals,
                *(f.text(fit.at(t)) + (" (fitted)" if t in sizes else " (derived)") for t in TARGETS),
                f.limit_text, "—" if f.limit is None else _crossing(fit.intercept, fit.slope, f.limit),
            )
        )  # fmt: skip
    fitted = Grid(
        f"{TITLE}: growth fitted",
        f"Each signal-side figure fitted as y = a + b × nodes by ordinary least squares over the "
        f"measured sizes ({measured}); the 100,000-node values (and 65,000 where it did not run) "
        "are this line's, not measurements.",
        ("figure", "a", "b", "residuals", "at 65,000", "at 100,000", "limit", "line reaches it at"),
        tuple(fit_rows),
    )
    return rounds, queries, cost, fitted


def runs_out_first(doc: Mapping[str, Any]) -> list[str]:
    """The limits each side reaches, by the fleet size it reaches them at, smallest first."""
    found: list[tuple[float, str]] = []
    signal = [s["signal"] for s in doc["signal"]]
    sizes = [s["nodes"] for s in signal]
    for f in SIGNAL_FIGURES:
        fit = least_squares(sizes, [f.value(s) for s in signal])
        if fit is None or f.limit is None:
            continue
        at = fit.crossing(f.limit)
        if math.isfinite(at):
            found.append((at, f"{f.name} reaches {f.limit_text} at about {_n(at)} nodes (fitted)"))
    pure = [p["pure"] for p in doc["pure"]]
    fit = (
        least_squares([p["nodes"] for p in pure], [p["restart_cpu"] for p in pure]) if len(pure) > 1 else None
    )
    if fit is not None:
        at = fit.crossing(RESTART_GOAL_SECONDS)
        found.append(
            (at, f"a whole policy round's CPU alone reaches the restart goal ({RESTART_GOAL_SECONDS:.0f} s) "
             f"at about {_n(at)} nodes")
        )  # fmt: skip
    return [text for _, text in sorted(found)]


def section(doc: Mapping[str, Any]) -> str:
    tables: list[Grid] = []
    if doc["pure"]:
        tables.append(pure_grid([p["pure"] for p in doc["pure"]]))
    if doc["signal"]:
        tables.extend(signal_grids(doc["signal"]))
    runs = doc.get("runs") or [{}]
    last = runs[-1]
    dates = "; ".join(f"{_n(s['signal']['nodes'])}: {s['machine']['date']}" for s in doc["signal"])
    machine = [
        ("date", f"{last.get('date', '—')} (signal side by size: {dates or '—'})"),
        ("command", "python -m bench fleet-65k"),
        ("CPU", f"nproc {last.get('nproc', '—')}; nothing pinned"),
        ("memory", f"{last.get('memory_gib', 0):.1f} GiB"),
        ("load average (1/5/15 min) at the end", str(last.get("load", "—"))),
        ("software", f"Linux {last.get('kernel', '—')}, Python {last.get('python', '—')}, "
                     "Prometheus and promtool 2.42.0 (Debian)"),
    ]  # fmt: skip
    notes = [
        "What runs out first, smallest fleet first: " + "; ".join(runs_out_first(doc)) + ".",
        *NOTES,
    ]
    return section_markdown(SECTION, title=TITLE, intro=INTRO, machine=machine, tables=tables, notes=notes)


NOTES = (
    "The nodes reported changed are those of the second of two rounds a scrape apart that the "
    "source tells the reconciler to evaluate. Until 2026-12-06 that was every node, every round: "
    "each reading carries its scrape's time, which moves at every scrape, so the reconciler's "
    "steady round was a whole policy round (the resync column above) each interval. A reading "
    "that differs only in its time is no change since, while the last is fresh (`is_news`, "
    "gpumon/controller/core/signals.py): the reconciler's staleness checks follow its time.",
    "The TSDB holds the families the controller's queries read, with the exporter's labels "
    "(node, gpu, uuid; the pod series' namespace, pod, container) and the two a static scrape adds "
    "(instance, job); a real fleet's Prometheus holds the exporter's other families too (clocks, "
    "power, NVLink and more), which no selector here touches, and a "
    "Prometheus Operator scrape adds namespace, pod, service, endpoint and container labels to "
    "every series, which makes every answer larger than here.",
    "Four samples per series, 280 s apart, at -850, -570, -290 and -10 s of the query time: the "
    "Xid query's `offset 600s` and `increase(...[600s])` see what they would at a 15 s scrape; "
    "an instant selector decodes fewer samples per chunk than at 15 s. The data sit in a "
    "persistent block, not in the head where a live Prometheus holds its last two hours: the first "
    "of the 3 runs of each query reads the block from the page cache or the disk.",
    "promtool holds every series of its input in memory (about 3 KiB each), so the TSDB is built "
    "in parts of 5,000 nodes whose blocks overlap in time; Prometheus merges them itself before "
    "any query runs. The merge, promtool and the text are the method's cost, not the controller's.",
    "The machine has 2 cores shared with other work, and Prometheus, the source's process and the "
    "timing client share them: wall times include waiting for a core; CPU seconds do not.",
)

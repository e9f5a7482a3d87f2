"""``python -m bench fleet-65k`` on a tiny fleet: the generated fleet, its OpenMetrics text (the
exporter's own label names, parsed by an OpenMetrics parser, and by promtool into a TSDB that the
controller's Prometheus source reads back to the verdicts the model's readings give:
tests/prometheus/test_bench_fleet_tsdb.py), the report's derived rows and what runs out first."""

from __future__ import annotations

import io

import pytest
from bench_fleet import TINY, verdicts
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from bench.fleet_model import FAULTS, GPUS_PER_NODE, Fleet, marks, node_views, readings
from bench.fleet_openmetrics import write_openmetrics
from bench.fleet_report import runs_out_first, section
from bench.naive_server import NaiveCollector
from bench.pods import BenchPods
from gpumon.devices.simulated import SimulatedBackend
from gpumon.gpu.health import Severity

pytestmark = pytest.mark.unit

AT = 1_800_000_000.0


def _text(fleet: Fleet) -> str:
    out = io.StringIO()
    write_openmetrics(fleet, marks(fleet), AT, out)
    return out.getvalue()


def test_the_fleet_is_the_same_for_the_same_seed_and_faults_its_share() -> None:
    assert marks(TINY) == marks(Fleet(12, 0.2, 3))
    assert marks(TINY) != marks(Fleet(12, 0.2, 4))
    assert len(marks(TINY).faults) == round(TINY.gpus * 0.2)
    assert {f.kind for f in marks(Fleet(500, 0.01)).faults.values()} == {f.kind for f, _ in FAULTS}
    nodes = list(readings(TINY, marks(TINY), AT))
    assert [len(n.gpus) for n in nodes] == [GPUS_PER_NODE] * TINY.nodes
    assert [v.name for v in node_views(TINY)] == [n.node for n in nodes]


def test_the_text_parses_and_counts_its_series() -> None:
    text = _text(TINY)
    assert text.endswith("# EOF\n")
    series: dict[tuple[str, frozenset[tuple[str, str]]], int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            series[key] = series.get(key, 0) + 1
    assert len(series) == write_openmetrics(TINY, marks(TINY), AT, io.StringIO())
    # Four scrapes; three for an Xid first counted within the window.
    assert set(series.values()) == {3, 4}


def test_each_family_has_the_exporters_labels_plus_instance_and_job() -> None:
    exported: dict[str, set[frozenset[str]]] = {}
    for family in NaiveCollector(SimulatedBackend(GPUS_PER_NODE), BenchPods(8), "n").collect():
        for s in family.samples:
            exported.setdefault(s.name, set()).add(frozenset(s.labels))
    # The bench pods share their GPUs, so none is allocated whole: catalog_native labels an
    # allocation as the pod's other series, plus the resource.
    used = exported["gpumon_pod_gpu_memory_used_bytes"]
    exported["gpumon_pod_gpu_allocated"] = {labels | {"resource"} for labels in used}
    written: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(_text(TINY)):
        for s in family.samples:
            written.setdefault(s.name, set()).add(frozenset(s.labels) - {"instance", "job"})
    # The simulated GPUs count no Xid: its labels are the GPU's and the code.
    xids = written.pop("gpumon_gpu_xid_errors_total")
    assert xids == {frozenset({"node", "gpu", "uuid", "xid"})}
    for name, labels in written.items():
        assert labels <= exported[name], name


def test_the_model_faults_give_verdicts() -> None:
    judged = verdicts({r.node: r for r in readings(TINY, marks(TINY), AT - 10)}, AT)
    assert Severity.UNHEALTHY in {s for s, _ in judged.values()}
    assert sum(len(g) for _, g in judged.values()) <= len(marks(TINY).faults)


def _doc(sizes: list[int]) -> dict[str, object]:
    def signal(n: int) -> dict[str, object]:
        query = {
            "name": "q",
            "promql": "up",
            "seconds": n / 10_000,
            "samples": 8 * n,
            "answer_bytes": 300 * n,
        }
        one = {"wall": n / 5_000, "cpu": n / 6_000, "rss": 9e3 * n, "hwm": 1e4 * n, "ok": True,
               "nodes": n, "changed": n}  # fmt: skip
        return {
            "signal": {
                "nodes": n, "fleet": {"nodes": n}, "checkout": [query], "naive": [query],
                "default_round": {"rounds": [{**one, "ok": n < 5_000}]},
                "patient_round": {"rss_start": 6e7, "rounds": [one, one]},
                "build": {"series": 180 * n, "text_bytes": 1.4e5 * n, "write_seconds": 1.0,
                          "promtool_seconds": 2.0, "promtool_peak_rss": 3e9, "parts": 1},
                "tsdb_bytes": 2.4e4 * n, "start_seconds": 1.0, "compaction_seconds": 0.0,
                "prometheus_rss_idle": 1e8, "prometheus_rss_peak": 1e9,
            },
            "machine": {"date": "today"},
        }  # fmt: skip

    pure = {"nodes": 1000, "gpus": 8000, "faulted_gpus": 24, "nodes_with_findings": 24, "candidates": 20,
            "admitted": 5, "drains": 16, "state_bytes": 6e6, "restart_cpu": 0.15, "resync_cpu": 0.15,
            "healthy_cpu": 1.4e-4, "bad_cpu": 1.6e-4, "admit_cpu": 1e-4, "drain_cpu": 1e-3,
            "scale_plan_cpu": 0.02, "scale_inputs_cpu": 0.01}  # fmt: skip
    return {
        "pure": [{"pure": pure}, {"pure": {**pure, "nodes": 2000, "restart_cpu": 0.3}}],
        "signal": [signal(n) for n in sizes],
        "runs": [{"date": "today"}],
    }


def test_the_report_derives_the_sizes_it_did_not_run_and_names_the_first_limit() -> None:
    text = section(_doc([2_000, 10_000]))
    assert "**65,000 (derived)**" in text and "**100,000 (derived)**" in text
    assert "**failed**" in text  # the default-timeout round of 10,000 nodes
    first = runs_out_first(_doc([2_000, 10_000]))
    # wall n/5,000 reaches 10 s at 50,000 nodes; the longest query n/10,000 reaches 5 s at 50,000
    # too; CPU n/6,000 at 60,000; the peak RSS 10 kB a node 1 GiB at 107,374; the policy round
    # 0.15 s per 1,000 nodes 30 s at 200,000.
    assert first[0].startswith(("round wall", "longest query")) and "50,000 nodes" in first[0]
    assert "60,000 nodes" in first[2] and "200,000 nodes" in first[-1]
    assert "(derived)" not in section(_doc([2_000, 65_000, 100_000])).split("growth fitted")[0]

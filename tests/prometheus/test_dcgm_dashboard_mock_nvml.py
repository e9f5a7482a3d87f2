"""NVIDIA's dcgm-exporter dashboard, every panel the Tensor Core one included, on a real
Prometheus scraping ``gpumon exporter --backend nvml`` over NVIDIA's mock libnvidia-ml (the
H100 profile, whose GPUs offer GPM): the profiling panels get their data from NVML alone, with no
DCGM host engine. The simulated exporter's run of the same dashboard is in
test_exposition_prometheus.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ExporterProcess, PrometheusProcess
from test_exposition_prometheus import dashboard_queries, substitute, variable_values

from gpumon.devcluster.binaries import MockNvml

JOB = "gpumon-nvml"


@pytest.fixture(scope="module")
def nvml_exporter(mock: MockNvml, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExporterProcess]:
    workdir: Path = tmp_path_factory.mktemp("nvml-exporter")
    process = ExporterProcess(
        workdir,
        "--backend", "nvml", "--metrics-profile", "dcgm", "--node-name", "h100-node",
        "--fast-interval", "0.25", "--slow-interval", "0.5",
        env={
            "LD_LIBRARY_PATH": str(mock.lib_dir),
            "MOCK_NVML_CONFIG": str(mock.profile("h100")),
            "GPUMON_PODS__ENABLED": "false",
        },
    )  # fmt: skip
    try:
        process.start()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def scraping_nvml(
    prometheus: PrometheusProcess, nvml_exporter: ExporterProcess
) -> Iterator[PrometheusProcess]:
    prometheus.configure(prometheus.config({JOB: [nvml_exporter.target]}))
    # GPM needs two slow ticks for its first interval; the panels read its series.
    prometheus.wait_for(f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{job="{JOB}"}}', timeout=120)
    yield prometheus
    prometheus.configure(prometheus.config())


def test_every_panel_of_nvidias_dashboard_has_data_from_the_mock_library(
    scraping_nvml: PrometheusProcess, nvml_exporter: ExporterProcess
) -> None:
    values = variable_values(scraping_nvml)
    # The session's Prometheus may remember the simulated exporter an earlier module scraped:
    # the dashboard is looked at with this exporter chosen, so every panel answers from it.
    assert nvml_exporter.target in values["instance"]
    values["instance"] = [nvml_exporter.target]

    queries = dashboard_queries()
    fields = {m for e in queries for m in re.findall(r"DCGM_F\w+", e)}
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in fields  # the Tensor Core panel is among them
    empty = [expr for expr in queries if not scraping_nvml.query(substitute(expr, values))]
    assert empty == []
    # All eight GPUs of the profile, in the Tensor Core panel as in the others.
    tensor = scraping_nvml.query(f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{job="{JOB}"}}')
    assert sorted(int(s["metric"]["gpu"]) for s in tensor) == list(range(8))

"""The demo's fleet: names and ports, and configurations the real config models accept."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.config import ExporterConfig
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import pool_from_config
from gpumon.demo import fleet, scenario


def _fleet() -> tuple[scenario.Scenario, fleet.Fleet]:
    s = scenario.load(None)
    return s, fleet.build(s, list(range(20000, 20000 + fleet.ports_needed(s))))


def test_every_node_name_the_pool_may_use_has_its_own_exporter_port() -> None:
    s, f = _fleet()
    names = [spec.name for spec in (*f.static, *f.pool_candidates)]
    assert names[:2] == [fleet.SHARED_NODE, fleet.WINDOWS_NODE]
    assert names[2:] == [f"gpu-pool-{i}" for i in range(12)]  # twice the pool's 3 + 3
    assert len(set(f.endpoints.values())) == len(names)
    assert f.spec("gpu-pool-4") is not None and f.spec("gpu-pool-12") is None
    with pytest.raises(ValueError, match="need 14 ports"):
        fleet.build(s, [1, 2])


def test_the_controller_config_is_valid_and_acts() -> None:
    s, f = _fleet()
    doc = fleet.controller_config(f, s, kubeconfig=Path("/k"), port=1234)
    cfg = ControllerConfig.model_validate(doc)
    assert not cfg.dry_run and cfg.signals.source == "direct"
    assert cfg.signals.direct.endpoints["gpu-pool-0"] == "http://127.0.0.1:20002"
    assert cfg.policy.recover_after_seconds == s.controller.recover_after_seconds
    pool = pool_from_config(cfg.pools[0])
    assert pool.max_replicas == 6 and not pool.replace_quarantined
    # The repair step's ladder: a reset, then a validation; no reboot or replacement.
    assert pool.repair is not None
    policy = pool.repair.policy
    assert policy.reset and policy.validate and not policy.reboot and not policy.replace
    assert {s.value for s in pool.repair.templates} == {"reset", "validate"}
    without = scenario.Scenario.model_validate({"steps": [{"name": "a", "expect": "steady"}]})
    plain = ControllerConfig.model_validate(
        fleet.controller_config(f, without, kubeconfig=Path("/k"), port=1)
    )
    assert plain.pools[0].repair is None, "no repair step: the ladder stays off"
    # A trainer pod selects linux nodes; a new pool node must be seen to offer that.
    assert pool.template.labels["kubernetes.io/os"] == "linux"


def test_each_exporter_config_is_valid() -> None:
    s, f = _fleet()
    for spec in f.static[:1] + f.pool_candidates[:1]:
        doc = fleet.exporter_config(spec, s, pod_resources_socket=Path("/s"), host_proc=Path("/p"))
        cfg = ExporterConfig.model_validate(doc)
        assert cfg.node_name == spec.name and cfg.port == spec.port and cfg.backend == "simulated"
        assert cfg.simulation.gpus == spec.template.gpu_count
    assert f.static[0].template.shared is not None and f.static[1].template.os == "windows"


def test_workloads_fit_and_the_trainer_has_a_disruption_budget() -> None:
    s, _ = _fleet()
    objs = {(o["kind"], o["metadata"]["name"]): o for o in fleet.workloads(s)}
    assert set(objs) == {
        ("Deployment", "trainer"),
        ("PodDisruptionBudget", "trainer"),
        ("Deployment", "notebook"),
        ("Deployment", "inference-win"),
    }
    assert objs[("PodDisruptionBudget", "trainer")]["spec"]["maxUnavailable"] == 1
    # The shared node's notebooks fit its GPUs.
    assert fleet.SHARED_REPLICAS * fleet.SHARED_GIB_PER_POD <= fleet.SHARED_GPUS * fleet.SHARED_GIB_PER_GPU
    assert fleet.expected_apps(s, 12) == {"trainer": 12, "notebook": 3, "inference-win": 1}

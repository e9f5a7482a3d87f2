"""The demo's fleet: the pool Cluster API makes, exporter ports and the file that lists them,
and configurations the real config models accept."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.config import ExporterConfig
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import pool_from_config
from gpumon.demo import fleet, scenario
from gpumon.devcluster import capi
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.wire import file_sd


def _fleet() -> tuple[scenario.Scenario, fleet.Fleet]:
    s = scenario.load(None)
    return s, fleet.build(s, list(range(20000, 20000 + fleet.ports_needed(s))))


def test_static_nodes_get_ports_up_front_and_pool_nodes_theirs_on_joining() -> None:
    s, f = _fleet()
    assert [spec.name for spec in f.static] == [fleet.SHARED_NODE, fleet.WINDOWS_NODE]
    assert [spec.port for spec in f.static] == [20000, 20001]
    joined = f.pool_spec("gpu-pool-x7k2p-4nq8d", s, seed=3, port=31000)
    assert (joined.port, joined.seed, joined.template) == (31000, 3, f.pool_template)
    assert f.static_spec("gpu-pool-x7k2p-4nq8d") is None
    with pytest.raises(ValueError, match="need 2 ports"):
        fleet.build(s, [1])


def test_the_pool_is_a_cluster_api_machine_deployment_of_the_pool_nodes_shape() -> None:
    s, f = _fleet()
    objs = fleet.pool_objects(f, s, manager_kubeconfig="kubeconfig: yes")
    kinds = [o["kind"] for o in objs]
    assert kinds[-2:] == ["KwokMachineTemplate", "MachineDeployment"] and "Cluster" in kinds
    template, md = objs[-2:]
    assert md["spec"]["replicas"] == s.fleet.pool_nodes
    node = template["spec"]["template"]["spec"]["node"]
    assert node["labels"][POOL_LABEL] == fleet.POOL
    assert node["resources"]["nvidia.com/gpu"] == str(s.fleet.gpus_per_node)
    assert {capi.collection_path(o) for o in objs} >= {
        f"/api/v1/namespaces/{fleet.NAMESPACE}/secrets",
        capi.machine_deployments_path(fleet.NAMESPACE),
    }


def test_the_targets_file_lists_each_exporter_under_its_node_for_both_readers() -> None:
    body = fleet.targets_file_body({"gpu-pool-a": 31000, fleet.SHARED_NODE: 20000})
    groups = file_sd.parse(body, yaml_format=False)
    assert file_sd.exporter_urls(groups, node_label="node", scheme="http") == {
        "gpu-pool-a": "http://127.0.0.1:31000",
        fleet.SHARED_NODE: "http://127.0.0.1:20000",
    }
    scrape = fleet.prometheus_config(targets_file=Path("/t.json"), controller_port=1)["scrape_configs"][0]
    assert scrape["file_sd_configs"] == [{"files": ["/t.json"]}] and scrape["honor_labels"] is True


def test_the_controller_config_is_valid_and_acts() -> None:
    s, f = _fleet()
    doc = fleet.controller_config(f, s, kubeconfig=Path("/k"), port=1234, targets_file=Path("/t.json"))
    cfg = ControllerConfig.model_validate(doc)
    assert not cfg.dry_run and cfg.signals.source == "direct"
    assert cfg.signals.direct.targets_file == Path("/t.json") and not cfg.signals.direct.endpoints
    assert cfg.policy.recover_after_seconds == s.controller.recover_after_seconds
    pool = pool_from_config(cfg.pools[0])
    assert pool.max_replicas == 6 and not pool.replace_quarantined
    # The repair and flap steps' ladder: a reset, a validation and the replacement; no reboot.
    assert pool.repair is not None
    policy = pool.repair.policy
    assert policy.reset and policy.validate and policy.replace and not policy.reboot
    assert {s.value for s in pool.repair.templates} == {"reset", "validate"}
    steps = [st.model_dump(exclude_defaults=True) for st in s.steps]
    no_flap = scenario.Scenario.model_validate({"steps": [st for st in steps if st["name"] != "flap"]})
    reset_only = ControllerConfig.model_validate(
        fleet.controller_config(f, no_flap, kubeconfig=Path("/k"), port=1, targets_file=Path("/t"))
    )
    assert reset_only.pools[0].repair is not None and reset_only.pools[0].repair.steps == ["reset"]
    without = scenario.Scenario.model_validate({"steps": [{"name": "a", "expect": "steady"}]})
    plain = ControllerConfig.model_validate(
        fleet.controller_config(f, without, kubeconfig=Path("/k"), port=1, targets_file=Path("/t"))
    )
    assert plain.pools[0].repair is None, "no repair step: the ladder stays off"
    # A trainer pod selects linux nodes; a new pool node must be seen to offer that.
    assert pool.template.labels["kubernetes.io/os"] == "linux"


def test_each_exporter_config_is_valid() -> None:
    s, f = _fleet()
    for spec in (f.static[0], f.pool_spec("gpu-pool-a", s, seed=1, port=31000)):
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

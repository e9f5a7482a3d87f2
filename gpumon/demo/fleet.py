"""The demo's cluster, built from its scenario: the nodes outside the pool, the pool Cluster API
makes, the workloads, and the configuration of the exporters, the controller and Prometheus.
Pure builders; :mod:`gpumon.demo.orchestrate` applies them.

The pool is a Cluster API MachineDeployment reconciled by Cluster API's own manager, whose
Machines the devcluster's kwok infrastructure provider turns into kwok Nodes named after them
(gpumon.devcluster.capi_infra_plan). Names are known only once a node joins, so its exporter
gets a port then, and the exporters are listed in one Prometheus file_sd file
(:func:`targets_file_body`) that Prometheus scrapes them from and the controller reads them
from (``signals.direct.targets_file``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpumon.demo.scenario import Scenario
from gpumon.devcluster import capi, nodes
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.workloads import APP_LABEL, gpu_deployment
from gpumon.k8s.resources import DIRECTX_RESOURCE, GPUSHARE_MEMORY_RESOURCE
from gpumon.wire import file_sd

NAMESPACE = "gpumon-demo"
CONTROLLER_NAMESPACE = "gpumon-system"
POOL = "gpu-pool"
WORKLOAD = "trainer"
SHARED_APP = "notebook"
WINDOWS_APP = "inference-win"
SHARED_NODE = "gpu-shared-0"
WINDOWS_NODE = "gpu-win-0"
SHARED_MODEL = "T4"
SHARED_GIB_PER_GPU = 15  # a T4's 15360 MiB, in the device plugin's GiB
SHARED_GPUS = 2
SHARED_REPLICAS = 3
SHARED_GIB_PER_POD = 4
WINDOWS_MODEL = "L40S"
EXPORTER_JOB = "gpumon-exporter"
CONTROLLER_JOB = "gpumon-controller"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node the demo runs an exporter for."""

    name: str
    template: nodes.NodeTemplate
    model: str  # the simulated GPU model its exporter reports
    seed: int
    port: int


@dataclass(frozen=True, slots=True)
class Fleet:
    pool_template: nodes.NodeTemplate
    static: tuple[NodeSpec, ...]  # created by the demo, outside the pool

    def static_spec(self, name: str) -> NodeSpec | None:
        return next((s for s in self.static if s.name == name), None)

    def pool_spec(self, name: str, scenario: Scenario, *, seed: int, port: int) -> NodeSpec:
        """The exporter of a pool node that joined, on the port chosen for it then."""
        return NodeSpec(name, self.pool_template, scenario.fleet.gpu_model, seed, port)


def product(model: str) -> str:
    return f"NVIDIA-{model}"


def ports_needed(scenario: Scenario) -> int:
    """The ports chosen up front: the static nodes' exporters (pool nodes get theirs on joining)."""
    return int(scenario.fleet.shared_node) + int(scenario.fleet.windows_node)


def build(scenario: Scenario, ports: Sequence[int]) -> Fleet:
    f = scenario.fleet
    if len(ports) != ports_needed(scenario):
        raise ValueError(f"need {ports_needed(scenario)} ports, got {len(ports)}")
    free = iter(ports)
    pool_template = nodes.NodeTemplate(gpus=f.gpus_per_node, product=product(f.gpu_model))
    static = []
    if f.shared_node:
        shared = nodes.NodeTemplate(
            gpus=0, shared=nodes.SharedGpus(SHARED_GPUS, SHARED_GIB_PER_GPU), product=product(SHARED_MODEL)
        )
        static.append(NodeSpec(SHARED_NODE, shared, SHARED_MODEL, 101, next(free)))
    if f.windows_node:
        windows = nodes.NodeTemplate(gpus=1, os="windows", product=product(WINDOWS_MODEL))
        static.append(NodeSpec(WINDOWS_NODE, windows, WINDOWS_MODEL, 102, next(free)))
    return Fleet(pool_template, tuple(static))


# ---------------------------------------------------------------------------------------------
# Objects in the cluster


def namespaces() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in (NAMESPACE, CONTROLLER_NAMESPACE)
    ]


def controller_configmap() -> dict[str, Any]:
    # Holds open breakers and the pause switch; the controller does not create it.
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpumon-controller", "namespace": CONTROLLER_NAMESPACE},
    }


def pool_objects(the_fleet: Fleet, scenario: Scenario, *, manager_kubeconfig: str) -> list[dict[str, Any]]:
    """In creation order: the Cluster the pool belongs to (a self-hosted management cluster:
    its kubeconfig points back at the demo's API server), the KwokMachineTemplate with the pool
    node's shape, and the MachineDeployment."""
    shape = nodes.shape(the_fleet.pool_template, {POOL_LABEL: POOL})
    return [
        *capi.management_cluster(NAMESPACE, manager_kubeconfig),
        *capi.machine_pool(POOL, NAMESPACE, shape, replicas=scenario.fleet.pool_nodes),
    ]


def _deployment(
    app: str,
    replicas: int,
    limits: Mapping[str, str],
    node_selector: Mapping[str, str],
) -> dict[str, Any]:
    return gpu_deployment(
        app,
        replicas=replicas,
        limits=limits,
        node_selector=node_selector,
        namespace=NAMESPACE,
        image="nvcr.io/nvidia/pytorch:24.08-py3",
    )


def workloads(scenario: Scenario) -> list[dict[str, Any]]:
    """The GPU Deployments (the trainer on the pool, a notebook on the shared node, a Windows
    inference pod) and the trainer's PodDisruptionBudget."""
    w, f = scenario.workload, scenario.fleet
    linux = {"kubernetes.io/os": "linux"}
    out = [
        _deployment(WORKLOAD, w.replicas, {nodes.GPU: str(w.gpus_per_pod)}, linux),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": WORKLOAD, "namespace": NAMESPACE},
            "spec": {"maxUnavailable": w.max_unavailable, "selector": {"matchLabels": {APP_LABEL: WORKLOAD}}},
        },
    ]
    if f.shared_node:
        out.append(
            _deployment(
                SHARED_APP, SHARED_REPLICAS, {GPUSHARE_MEMORY_RESOURCE: str(SHARED_GIB_PER_POD)}, linux
            )
        )
    if f.windows_node:
        out.append(_deployment(WINDOWS_APP, 1, {DIRECTX_RESOURCE: "1"}, {"kubernetes.io/os": "windows"}))
    return out


def expected_apps(scenario: Scenario, workload_replicas: int) -> dict[str, int]:
    """App -> replicas that should be Running."""
    f = scenario.fleet
    out = {WORKLOAD: workload_replicas}
    if f.shared_node:
        out[SHARED_APP] = SHARED_REPLICAS
    if f.windows_node:
        out[WINDOWS_APP] = 1
    return out


# ---------------------------------------------------------------------------------------------
# Configuration of the processes


def exporter_config(
    spec: NodeSpec, scenario: Scenario, *, pod_resources_socket: Path, host_proc: Path
) -> dict[str, Any]:
    return {
        "node_name": spec.name,
        "listen_address": "127.0.0.1",
        "port": spec.port,
        "backend": "simulated",
        "simulation": {"gpus": spec.template.gpu_count, "model": spec.model, "seed": spec.seed},
        # Pods are placed (pod-resources) on the slow cadence: keep it short for the demo.
        "sampling": {"fast_interval_seconds": 1, "slow_interval_seconds": 1},
        "health": {"xid_window_seconds": scenario.controller.xid_window_seconds},
        # No process of a kwok pod exists: an empty /proc attributes none, allocations remain.
        "pods": {"pod_resources_socket": str(pod_resources_socket), "host_proc": str(host_proc), "api": True},
    }


# The pool's repair ladder when a step asks for a repair: a reset, then a validation before the
# quarantine lifts (no reboot: kwok has no host to reboot, and the demo no story for one). The
# reset is the chart's default command (controller.repairJobs.reset); the validation an example
# of one. kwok completes both Jobs' pods without running a command: the demo plays the reset's
# effect. With a step expecting a replacement, the last rung is on too (repair_config).
REPAIR: Mapping[str, Any] = MappingProxyType(
    {
        "steps": ["reset"],
        "reset_deadline_seconds": 120,
        "replace_deadline_seconds": 120,
        "validate_deadline_seconds": 120,
        "reset_job": {
            "template": {
                "spec": {
                    "hostPID": True,
                    "containers": [
                        {
                            "name": "gpu-reset",
                            "image": "ubuntu:24.04",
                            "securityContext": {"privileged": True},
                            "command": ["/bin/sh", "-c"],
                            "args": [
                                'for g in $(echo "$GPUMON_GPU_UUIDS" | tr , " "); do nsenter -t 1 -m -u -i '
                                '-n -p -- nvidia-smi --gpu-reset -i "$g" || exit 1; done'
                            ],
                        }
                    ],
                }
            }
        },
        "validation_job": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "dcgm-diag",
                            "image": "nvcr.io/nvidia/cloud-native/dcgm",
                            "command": ["dcgmi", "diag", "-r", "1"],
                        }
                    ]
                }
            }
        },
    }
)


def repair_config(scenario: Scenario) -> dict[str, Any]:
    """:data:`REPAIR`, with the replacement rung when a step expects a machine replaced (the
    same GPU faulting again within the flap window: Cluster API's MachineSet makes the new one)."""
    steps = [*REPAIR["steps"], *(["replace"] if scenario.replaces else [])]
    return {**REPAIR, "steps": steps}


def controller_config(
    fleet: Fleet, scenario: Scenario, *, kubeconfig: Path, port: int, targets_file: Path
) -> dict[str, Any]:
    f, t = scenario.fleet, scenario.controller
    repair = {"repair": repair_config(scenario)} if scenario.repairs else {}
    return {
        "dry_run": False,
        "kubeconfig": str(kubeconfig),
        "namespace": CONTROLLER_NAMESPACE,
        "identity": "gpumon-demo",
        "listen_address": "127.0.0.1",
        "port": port,
        "signals": {
            "source": "direct",
            "stale_after_seconds": 30,
            "direct": {
                "targets_file": str(targets_file),
                "targets_refresh_seconds": 0.5,
                "heartbeat_seconds": 2,
                "poll_interval_seconds": 1,
            },
        },
        "policy": {
            "recover_after_seconds": t.recover_after_seconds,
            "health": {"xid_window_seconds": t.xid_window_seconds},
        },
        "drain": {"deadline_seconds": 120, "retry_initial_seconds": 1, "retry_max_seconds": 5},
        "pools": [
            {
                "name": POOL,
                "target": {"namespace": NAMESPACE, "name": POOL},
                "node_selector": f"{POOL_LABEL}={POOL}",
                "template": nodes.pool_template(fleet.pool_template),
                "min_replicas": 1,
                "max_replicas": f.pool_nodes + f.max_extra_nodes,
                "scale_down_unneeded_seconds": t.scale_down_unneeded_seconds,
                "scale_down_cooldown_seconds": 0,
                "scale_down_drain_timeout_seconds": 60,
                # One story per step: the quarantined node is not replaced, the burst scales up.
                "replace_quarantined": False,
                **repair,
            }
        ],
        "log": {"format": "text", "level": "info"},
    }


def prometheus_config(*, targets_file: Path, controller_port: int) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            # The demo rewrites the file as exporters come and go; Prometheus watches it. The
            # exporter's own node label is the one the file gives its target: kept as it is,
            # not renamed exported_node.
            {
                "job_name": EXPORTER_JOB,
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(targets_file)]}],
            },
            {"job_name": CONTROLLER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}]},
        ],
    }


def targets_file_body(ports: Mapping[str, int]) -> bytes:
    """The exporters as Prometheus and the controller find them: node name -> loopback port."""
    return file_sd.dump({name: f"127.0.0.1:{port}" for name, port in ports.items()})

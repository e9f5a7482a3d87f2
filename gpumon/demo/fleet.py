"""The demo's cluster, built from its scenario: which nodes exist and which may join, the port of
each node's exporter, the workloads, and the configuration of the exporters, the controller and
Prometheus. Pure builders; :mod:`gpumon.demo.orchestrate` applies them.

The pool is a Cluster API MachineDeployment that the devcluster pool simulator turns into kwok
nodes named ``gpu-pool-<n>``. The controller reads every exporter through a static node -> URL
map (kwok pods are not processes, so exporters cannot be found as pods), so each name a pool
node may get has its port chosen up front; an exporter runs on it while that node exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpumon.demo.scenario import Scenario
from gpumon.devcluster import capi, nodes
from gpumon.devcluster.poolplan import POOL_LABEL
from gpumon.devcluster.workloads import APP_LABEL, gpu_deployment
from gpumon.k8s.resources import DIRECTX_RESOURCE, GPUSHARE_MEMORY_RESOURCE

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
    pool_candidates: tuple[NodeSpec, ...]  # every name a pool node may get in this run

    def spec(self, name: str) -> NodeSpec | None:
        return next((s for s in (*self.static, *self.pool_candidates) if s.name == name), None)

    @property
    def endpoints(self) -> Mapping[str, str]:
        """Node name -> exporter base URL, for the controller's direct signals."""
        return MappingProxyType(
            {s.name: f"http://127.0.0.1:{s.port}" for s in (*self.static, *self.pool_candidates)}
        )


def product(model: str) -> str:
    return f"NVIDIA-{model}"


def candidate_count(scenario: Scenario) -> int:
    # Names grow past the pool's size when nodes leave and others join; twice the maximum
    # covers a few rounds of that.
    return 2 * (scenario.fleet.pool_nodes + scenario.fleet.max_extra_nodes)


def ports_needed(scenario: Scenario) -> int:
    f = scenario.fleet
    return candidate_count(scenario) + int(f.shared_node) + int(f.windows_node)


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
    candidates = tuple(
        NodeSpec(f"{POOL}-{i}", pool_template, f.gpu_model, i, next(free))
        for i in range(candidate_count(scenario))
    )
    return Fleet(pool_template, tuple(static), candidates)


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


def machine_deployment(scenario: Scenario) -> dict[str, Any]:
    return capi.machine_deployment(POOL, NAMESPACE, replicas=scenario.fleet.pool_nodes)


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


# The pool's repair ladder when a step asks for a repair: a reset only (a reboot or a replacement
# is not part of the demo), then a validation before the quarantine lifts. The reset is the
# chart's default command (controller.repairJobs.reset); the validation an example of one. kwok
# completes both Jobs' pods without running a command: the demo plays the reset's effect.
REPAIR: Mapping[str, Any] = MappingProxyType(
    {
        "steps": ["reset"],
        "reset_deadline_seconds": 120,
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


def controller_config(fleet: Fleet, scenario: Scenario, *, kubeconfig: Path, port: int) -> dict[str, Any]:
    f, t = scenario.fleet, scenario.controller
    repair = {"repair": dict(REPAIR)} if scenario.repairs else {}
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
                "endpoints": dict(fleet.endpoints),
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
            # The demo rewrites the file as exporters come and go; Prometheus watches it.
            {"job_name": EXPORTER_JOB, "file_sd_configs": [{"files": [str(targets_file)]}]},
            {"job_name": CONTROLLER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}]},
        ],
    }


def file_sd_targets(ports: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"targets": [f"127.0.0.1:{port}" for _, port in sorted(ports.items())]}] if ports else []

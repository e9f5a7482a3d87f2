"""The whole HPA path on GPU utilization, up and back down:

simulated GPU load on a Deployment's pods → gpumon exporters (per-pod attribution) → a real
Prometheus → prometheus-adapter with deploy/prometheus-adapter/config.yaml, registered with the
aggregation layer → the HPA of deploy/examples/hpa-gpu-utilization.yaml in the real
kube-controller-manager raises replicas → the new pods are pending → ``gpumon controller``
(a real process) scales the node pool (a Cluster API MachineDeployment that Cluster API's own
manager turns into Machines and the kwok infrastructure provider into kwok nodes, their GPU
registering a second after they join: tests/capi_pools.py) → the pods run. Then the load drops:
the HPA lowers replicas and the controller drains and removes the idle nodes (Cluster API
deleting the Machines gpumon marked). Every step is read from the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from capi_pools import PoolFactory
from kubernetes_asyncio import client
from metrics_adapter import GROUP, external_metrics_api
from pool_exporters import PoolExporters

from gpumon.devcluster import capi
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.localservers import ControllerProcess, PrometheusProcess
from gpumon.devcluster.nodes import GPU, POOL_LABEL, NodeTemplate
from gpumon.devcluster.waiting import eventually
from gpumon.devcluster.workloads import gpu_deployment

REPO = Path(__file__).resolve().parents[2]
HPA_EXAMPLE = REPO / "deploy" / "examples" / "hpa-gpu-utilization.yaml"
TEST_LABEL = "test.gpumon.io/id"
APP = "inference"  # the example HPA's Deployment and its container (the metric's selector)
METRIC = "gpumon_workload_gpu_utilization_ratio"
MAX_REPLICAS = 3
STEADY, HIGH, LOW = 0.30, 0.95, 0.10  # per-pod SM busy fraction; the example's target is 0.7
# Deadlines of the waits, each well inside pytest's 300 s, so that a step that never happens
# fails with what was seen last instead of timing the whole test out. Measured here: the metric
# follows the load in 0.5-2 s, the way up takes 10-12 s, the way down 21 s (docs/e2e.md).
METRIC_SECONDS = 60.0
PATH_SECONDS = 90.0


def deployment(test_id: str) -> dict[str, Any]:
    return gpu_deployment(
        APP,
        replicas=1,
        limits={GPU: "1"},
        node_selector={TEST_LABEL: test_id},
        container=APP,
        image="inference:1",
    )


def hpa(namespace: str) -> dict[str, Any]:
    """The shipped example, in the test's namespace, at most 3 replicas (three nodes), and
    without its 10-minute scale-down window, so that the reverse path fits in a test."""
    doc: dict[str, Any] = yaml.safe_load(HPA_EXAMPLE.read_text())
    assert doc["spec"]["scaleTargetRef"]["name"] == APP
    assert doc["spec"]["metrics"][0]["external"]["metric"]["selector"] == {"matchLabels": {"container": APP}}
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["maxReplicas"] = MAX_REPLICAS
    doc["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] = 0
    return doc


def controller_config(
    cluster: DevCluster, namespace: str, test_id: str, pool: str, prometheus: str
) -> dict[str, Any]:
    return {
        "dry_run": False,
        "kubeconfig": str(cluster.kubeconfig),
        "namespace": namespace,
        "identity": "e2e-hpa",
        "node_selector": f"{TEST_LABEL}={test_id}",
        "signals": {"source": "prometheus", "interval_seconds": 2, "prometheus": {"url": prometheus}},
        "leader": {"lease_duration_seconds": 4, "renew_deadline_seconds": 3, "retry_period_seconds": 0.5},
        "pools": [
            {
                "name": "gpu",
                "target": {"namespace": namespace, "name": pool},
                "node_selector": f"{POOL_LABEL}={pool}",
                "template": {"resources": {GPU: 1}, "labels": {TEST_LABEL: test_id}},
                "min_replicas": 1,
                "max_replicas": MAX_REPLICAS,
                "scale_down_unneeded_seconds": 3,
                "scale_down_cooldown_seconds": 0,
            }
        ],
    }


def prometheus_config(targets_file: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "gpumon-exporter",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
            }
        ],
    }


@dataclass
class Cluster:
    """What the test reads, one call each."""

    api: client.ApiClient
    namespace: str
    pool: str
    exporters: PoolExporters
    seen: list[dict[str, int]] = field(default_factory=list)  # every state read
    metric_answers: list[str] = field(default_factory=list)  # every answer of the adapter

    async def external_metric(self) -> float | None:
        """The metric as the HPA controller reads it, through the aggregation layer."""
        self.exporters.check()
        path = f"/apis/{GROUP}/v1beta1/namespaces/{self.namespace}/{METRIC}"
        resp = await self.api.call_api(
            path,
            "GET",
            query_params=[("labelSelector", f"container={APP}")],
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        async with resp:
            body = await resp.json(content_type=None)
        self.metric_answers.append(f"{resp.status} {body}")  # e.g. 404 before the series are listed
        if resp.status != 200 or not body.get("items"):
            return None
        return float(sum(_quantity(i["value"]) for i in body["items"]))

    async def replicas(self) -> int:
        d = await client.AppsV1Api(self.api).read_namespaced_deployment(APP, self.namespace)
        return int(d.spec.replicas)

    async def pods(self) -> list[client.V1Pod]:
        listed = await client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=f"app={APP}"
        )
        return [p for p in listed.items if p.metadata.deletion_timestamp is None]

    async def pool_replicas(self) -> int:
        md = await client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            capi.GROUP, capi.VERSION, self.namespace, capi.MACHINE_DEPLOYMENTS, self.pool
        )
        return int(md["spec"].get("replicas", 0))

    async def pool_nodes(self) -> list[str]:
        listed = await client.CoreV1Api(self.api).list_node(label_selector=f"{POOL_LABEL}={self.pool}")
        return sorted(n.metadata.name for n in listed.items)

    async def state(self) -> dict[str, int]:
        self.exporters.check()
        pods = await self.pods()
        state = {
            "replicas": await self.replicas(),
            "running": sum(1 for p in pods if p.status.phase == "Running"),
            "unschedulable": sum(1 for p in pods if _unschedulable(p)),
            "pool_replicas": await self.pool_replicas(),
            "pool_nodes": len(await self.pool_nodes()),
        }
        self.seen.append(state)
        return state


def _quantity(text: str) -> float:
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)


def _unschedulable(pod: client.V1Pod) -> bool:
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or ())


class Milestones:
    """When each condition on the cluster's state first held, in seconds from ``start``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.start = time.monotonic()
        self.at: dict[str, float] = {}

    async def until(
        self, final: str, marks: dict[str, Callable[[dict[str, int]], bool]], timeout_seconds: float
    ) -> dict[str, int]:
        async def check() -> dict[str, int] | None:
            state = await self.cluster.state()
            now = time.monotonic() - self.start
            for name, holds in marks.items():
                if name not in self.at and holds(state):
                    self.at[name] = round(now, 1)
            return state if final in self.at else None

        result: dict[str, int] = await eventually(
            check,
            what=final,
            timeout_seconds=timeout_seconds,
            interval_seconds=0.25,
            seen=lambda: {"reached": dict(self.at), "state": self.cluster.seen[-1:]},
        )
        return result


@pytest.fixture
async def pool(capi_pool: PoolFactory, test_id: str) -> str:
    """A MachineDeployment of one-GPU kwok nodes (one node to begin with) on Cluster API's own
    controllers; a new node's GPU registers a second after it joins."""
    made = await capi_pool(
        replicas=1, template=NodeTemplate(gpus=1, labels={TEST_LABEL: test_id}), devices_after_seconds=1.0
    )
    return made.name


async def test_gpu_load_scales_the_deployment_and_its_node_pool_up_and_back_down(
    api: client.ApiClient, devcluster: DevCluster, namespace: str, test_id: str, pool: str, tmp_path: Path
) -> None:
    targets = tmp_path / "targets.json"
    exporters = PoolExporters(
        api, f"{POOL_LABEL}={pool}", namespace, f"app={APP}", tmp_path / "nodes", targets
    )
    prometheus = PrometheusProcess(tmp_path / "prometheus")
    controller = ControllerProcess(
        tmp_path / "controller",
        controller_config(devcluster, namespace, test_id, pool, prometheus.url),
        "--act",
    )
    cluster = Cluster(api, namespace, pool, exporters)
    try:
        prometheus.start(prometheus_config(targets))
        async with (
            exporters.serving(),
            external_metrics_api(
                api,
                devcluster,
                prometheus_port=prometheus.port,
                namespace=namespace,
                workdir=tmp_path / "adapter",
            ) as adapter,
        ):
            controller.start()
            await client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment(test_id))
            await client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
                namespace, hpa(namespace)
            )

            # Steady: one pod below the target, its metric served through the adapter.
            exporters.level = STEADY
            steady = await eventually(
                _metric_near(cluster, STEADY),
                what="the workload's metric at 0.3",
                timeout_seconds=METRIC_SECONDS,
                interval_seconds=0.5,
                seen=lambda: cluster.metric_answers[-1:],
            )
            assert await cluster.replicas() == 1

            # Load rises: 95 % on every pod. The HPA wants more pods than the nodes hold.
            up = Milestones(cluster)
            exporters.level = HIGH
            await eventually(
                _metric_near(cluster, HIGH),
                what="the metric at 0.95",
                timeout_seconds=METRIC_SECONDS,
                interval_seconds=0.25,
                seen=lambda: cluster.metric_answers[-1:],
            )
            up.at["metric_high"] = round(time.monotonic() - up.start, 1)
            final = await up.until(
                "all_running",
                {
                    "hpa_scaled_up": lambda s: s["replicas"] >= 2,
                    "pod_pending": lambda s: s["unschedulable"] >= 1,
                    "pool_scaled_up": lambda s: s["pool_replicas"] >= 2,
                    "second_pod_running": lambda s: s["running"] >= 2,
                    "all_running": lambda s: s["running"] == MAX_REPLICAS and s["replicas"] == MAX_REPLICAS,
                },
                timeout_seconds=PATH_SECONDS,
            )
            assert final["pool_replicas"] == MAX_REPLICAS and final["pool_nodes"] == MAX_REPLICAS
            assert _causal(up.at), up.at
            # Never more nodes asked for than pods: one one-GPU pod per one-GPU node.
            assert max(s["pool_replicas"] for s in cluster.seen) == MAX_REPLICAS

            # Load falls: 10 %. The HPA goes back to one pod, the controller removes idle nodes.
            down = Milestones(cluster)
            exporters.level = LOW
            final = await down.until(
                "pool_scaled_down",
                {
                    "hpa_scaled_down": lambda s: s["replicas"] == 1,
                    "pods_gone": lambda s: s["running"] == 1 and s["replicas"] == 1,
                    "pool_scaled_down": lambda s: s["pool_replicas"] == 1 and s["pool_nodes"] == 1,
                },
                timeout_seconds=PATH_SECONDS,
            )
            assert final["running"] == 1
            # The remaining pod's node is the one node left: only idle nodes were removed.
            (survivor,) = [p for p in await cluster.pods() if p.status.phase == "Running"]
            assert [survivor.spec.node_name] == await cluster.pool_nodes()
            print(
                f"\nadapter Available {adapter.available_after:.1f}s after registration; "
                f"steady metric {steady:.2f}\n"
                f"up (s from the load rising): {up.at}\n"
                f"down (s from the load falling): {down.at}"
            )
    finally:
        controller.stop()
        prometheus.stop()


def _causal(at: dict[str, float]) -> bool:
    """Each step no earlier than the one causing it (two may land in the same poll)."""
    order = [
        "metric_high",
        "hpa_scaled_up",
        "pod_pending",
        "pool_scaled_up",
        "second_pod_running",
        "all_running",
    ]
    times = [at[k] for k in order]
    return times == sorted(times)


def _metric_near(cluster: Cluster, value: float) -> Callable[[], Any]:
    async def check() -> float | None:
        got = await cluster.external_metric()
        return got if got is not None and abs(got - value) < 0.02 else None

    return check

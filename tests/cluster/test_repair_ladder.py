"""The repair ladder on the real local control plane: the controller (the shipped ServiceAccount
plus deploy/rbac/controller-autoscaling.yaml and controller-repair.yaml) quarantines a node of
a repairing pool whose simulated GPU's driver asks for a reset, runs the step's Job pinned to
the node, and follows it to the end of the ladder.

Where the tests stop: kwok runs no containers. Its stock stages complete a Job's pod (phase
Succeeded) as soon as it runs, and the Job controller of the real kube-controller-manager then
marks the Job succeeded; the node-local commands themselves (``nvidia-smi --gpu-reset``, a host
reboot) are never run here. What a successful command does to the GPU is played by the test:
when the Job has succeeded it resets the simulated GPU (fault ``clear``), and the controller
must then see the exporter report it healthy with action NONE. A Job that never finishes is a
pod held by a scheduling gate, which the real scheduler never binds.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from capi_pools import at_size
from controller_harness import (  # noqa: F401 - fixtures
    Exporter,
    KubeconfigFactory,
    Running,
    controller_config,
    events,
    exporters,
    fresh_signals,
    node_obj,
    our_taint,
    running,
    sa_kubeconfig_for_fixture,
    wait_for_event,
)
from kubernetes_asyncio import client

# The pool fixtures and helpers of the autoscaling tests: a MachineDeployment whose replicas
# Cluster API's own controllers turn into kwok nodes.
from test_autoscale_pools import PoolFactory, autoscaling, make_pool, pool_config  # noqa: F401

from gpumon.controller.core import contract as c
from gpumon.controller.core.contract.repair import node_key, record_from_json
from gpumon.devcluster.waiting import eventually

JOB = {"template": {"spec": {"containers": [{"name": "step", "image": "nvidia/cuda:12"}]}}}
NEVER = {  # a pod the scheduler never binds: its Job never finishes
    "template": {
        "spec": {
            "schedulingGates": [{"name": "test.gpumon.io/never"}],
            "containers": [{"name": "step", "image": "nvidia/cuda:12"}],
        }
    }
}


def repair(**over: Any) -> dict[str, Any]:
    return {
        "steps": ["reset", "reboot"],
        "reset_job": JOB,
        "reboot_job": JOB,
        "reset_deadline_seconds": 60,
        "reboot_deadline_seconds": 60,
        **over,
    }


async def jobs(batch: client.BatchV1Api, namespace: str, node: str) -> list[client.V1Job]:
    found = await batch.list_namespaced_job(
        namespace, label_selector=f"{c.LABEL_REPAIR_NODE}={node_key(node)}"
    )
    return sorted(found.items, key=lambda j: j.metadata.creation_timestamp)


async def succeeded_job(
    batch: client.BatchV1Api, namespace: str, node: str, step: str
) -> client.V1Job | None:
    for job in await jobs(batch, namespace, node):
        if job.metadata.labels.get(c.LABEL_REPAIR_STEP) == step and (job.status.succeeded or 0) > 0:
            return job
    return None


def ladder_done(
    core: client.CoreV1Api, node: str, uuid: str
) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    async def check() -> dict[str, Any] | None:
        obj = await node_obj(core, node)
        record = record_from_json((obj["metadata"].get("annotations") or {}).get(c.ANNOTATION_REPAIR))
        quarantined = c.ANNOTATION_QUARANTINED_AT in (obj["metadata"].get("annotations") or {})
        return obj if uuid in record.repaired and not record.attempts and not quarantined else None

    return check


@dataclass
class Scene:
    """One node of a repairing pool (one replica, never scaled, no replacement), its exporter,
    and the controller running."""

    core: client.CoreV1Api
    batch: client.BatchV1Api
    namespace: str
    node: str
    exporter: Exporter
    ctl: Running
    kubeconfig: Path
    test_id: str
    pools: list[dict[str, Any]]

    async def fault(self, gpu: int, action: str) -> str:
        """The driver asks for ``action`` on ``gpu``: its UUID, once the node is quarantined."""
        self.exporter.fault(gpu=gpu, fault="recovery_action", action=action)
        await eventually(lambda: _quarantined(self.core, self.node), what="the node quarantined")
        return self.exporter.uuid(gpu)

    async def job_done(self, step: str) -> client.V1Job:
        job: client.V1Job = await eventually(
            lambda: succeeded_job(self.batch, self.namespace, self.node, step),
            what=f"the {step} Job done",
            timeout_seconds=120,
        )
        return job

    async def ladder_done(self, uuid: str) -> dict[str, Any]:
        done: dict[str, Any] = await eventually(
            ladder_done(self.core, self.node, uuid),
            what="the ladder ended, quarantine lifted",
            timeout_seconds=90,
        )
        return done

    async def jobs(self) -> list[client.V1Job]:
        return await jobs(self.batch, self.namespace, self.node)

    async def events(self, reason: str | None = None) -> list[client.CoreV1Event]:
        return await events(self.core, "default", self.node, reason)  # a Node's Events


@pytest.fixture
async def scene_for(
    api: client.ApiClient,
    namespace: str,
    test_id: str,
    make_pool: PoolFactory,  # noqa: F811 - the fixture
    sa_kubeconfig_for: KubeconfigFactory,
) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def make(*, rbac: bool = True, **over: Any) -> AsyncIterator[Scene]:
        kubeconfig = await sa_kubeconfig_for(autoscaling=True, repair=rbac)
        pool = await make_pool(replicas=1)
        # Named after its Machine: known once Cluster API has made it.
        (node,) = await eventually(lambda: at_size(pool, 1), what="the pool's node", timeout_seconds=90)
        pools = [
            pool_config(
                pool,
                test_id,
                min_replicas=1,
                max_replicas=1,
                replace_quarantined=False,
                repair=repair(**over),
            )
        ]
        async with exporters([node], gpus=4) as ex:
            endpoints = {node: ex[node].url}
            async with autoscaling(kubeconfig, namespace, test_id, pools, endpoints=endpoints) as ctl:
                await eventually(lambda: fresh_signals(ctl, 1), what="the node's signals")
                core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
                yield Scene(core, batch, namespace, node, ex[node], ctl, kubeconfig, test_id, pools)

    return make


async def test_a_reset_the_driver_asks_for_brings_the_gpu_back(scene_for: Callable[..., Any]) -> None:
    async with scene_for() as scene:
        uuid = await scene.fault(1, "gpu_reset")
        job = await scene.job_done("reset")
        pod_spec = job.spec.template.spec
        terms = pod_spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_fields[0].values == [scene.node], "pinned to the node"
        env = {e.name: e.value for e in pod_spec.containers[0].env}
        assert (env["GPUMON_NODE"], env["GPUMON_GPU_UUIDS"], env["GPUMON_RECOVERY_ACTION"]) == (
            scene.node,
            uuid,
            "GPU_RESET",
        )
        scene.exporter.fault(gpu=1, fault="clear")  # the command's effect, played here
        obj = await scene.ladder_done(uuid)
        assert our_taint(obj) is None
        reasons = {e.reason for e in await scene.events()}
        assert {"GpuRepairStarted", "GpuRepairSucceeded", "GpuRepairDone"} <= reasons
        assert "GpuRepairEscalated" not in reasons
        assert len(await scene.jobs()) == 1, "one reset, no other step"
        async with aiohttp.ClientSession() as session, session.get(scene.ctl.url + "/metrics") as resp:
            metrics = await resp.text()
        pool = scene.pools[0]["name"]
        for line in (
            'gpumon_controller_repairs_total{result="started",step="reset"} 1.0',
            'gpumon_controller_repairs_total{result="succeeded",step="reset"} 1.0',
            'gpumon_controller_repairs_total{result="done",step="done"} 1.0',
            f'gpumon_controller_repairing_nodes{{pool="{pool}"}} 0.0',
            f'gpumon_controller_repair_gave_up_nodes{{pool="{pool}"}} 0.0',
        ):
            assert line in metrics, line


async def test_a_reset_that_never_finishes_times_out_and_a_reboot_follows(
    scene_for: Callable[..., Any],
) -> None:
    async with scene_for(reset_job=NEVER, reset_deadline_seconds=8) as scene:
        uuid = await scene.fault(0, "drain_and_reset")
        await scene.job_done("reboot")
        (failed,) = await scene.events("GpuRepairFailed")
        assert "reset of" in failed.message and "timed_out" in failed.message, failed.message
        (escalated,) = await scene.events("GpuRepairEscalated")
        assert "now reboot" in escalated.message
        scene.exporter.fault(gpu=0, fault="clear")  # the reboot's effect
        await scene.ladder_done(uuid)
        assert [j.metadata.labels[c.LABEL_REPAIR_STEP] for j in await scene.jobs()] == ["reset", "reboot"]


async def test_a_new_controller_continues_the_ladder_without_repeating_a_step(
    scene_for: Callable[..., Any],
) -> None:
    async with scene_for() as scene:
        uuid = await scene.fault(2, "gpu_reset")
        await scene.job_done("reset")
        await scene.ctl.crash()  # killed mid-ladder: the attempt is running, its Job done
        obj = await node_obj(scene.core, scene.node)
        record = record_from_json(obj["metadata"]["annotations"][c.ANNOTATION_REPAIR])
        assert record.running is not None and record.running.number == 1
        # The driver still asks for a reset: a controller that did not continue from the
        # record would start one again.
        cfg = controller_config(
            kubeconfig=scene.kubeconfig,
            namespace=scene.namespace,
            test_id=scene.test_id,
            endpoints={scene.node: scene.exporter.url},
            pools=scene.pools,
            identity="c1",
        )
        async with running(cfg) as second:
            loop = second.controller.repair
            assert loop is not None
            await eventually(lambda: _true(loop.rounds >= 3), what="three rounds of the new controller")
            assert len(await scene.jobs()) == 1, "the reset was not started again"
            scene.exporter.fault(gpu=2, fault="clear")
            await scene.ladder_done(uuid)
        assert len(await scene.jobs()) == 1
        started = await scene.events("GpuRepairStarted")
        assert len(started) == 1, [e.message for e in started]


async def test_an_open_breaker_holds_new_repairs_but_not_the_validation(
    scene_for: Callable[..., Any],
) -> None:
    async with scene_for(validation_job=JOB) as scene:
        core, state = scene.core, "gpumon-controller"
        key = f"breaker.gpumon.io/{scene.pools[0]['name']}"
        opened = {key: json.dumps({"openedAt": "2026-01-01T00:00:00Z", "reason": "a person said so"})}

        async def breaker(annotations: dict[str, str | None]) -> None:
            patch = {"metadata": {"annotations": annotations}}
            await core.patch_namespaced_config_map(state, scene.namespace, patch)

        await breaker(opened)
        uuid = await scene.fault(3, "gpu_reset")
        refused = await wait_for_event(core, "default", scene.node, "GpuRepairRefused")
        assert "circuit breaker open" in refused.message and "a person said so" in refused.message
        assert await scene.jobs() == [], "no step started"
        await breaker({key: None})  # a person closes it
        await scene.job_done("reset")
        await breaker(opened)  # and it opens again before the validation
        scene.exporter.fault(gpu=3, fault="clear")
        validation = await scene.job_done("validate")
        assert validation.metadata.labels[c.LABEL_REPAIR_STEP] == "validate"
        # The quarantine lifted only after the validation, and the ladder ended.
        await scene.ladder_done(uuid)
        succeeded = {
            e.message.split(" ")[0]: e.first_timestamp for e in await scene.events("GpuRepairSucceeded")
        }
        (recovered,) = await scene.events("GpuRecovered")
        assert recovered.first_timestamp >= succeeded["validate"] >= succeeded["reset"], (
            succeeded,
            recovered,
        )
        assert [j.metadata.labels[c.LABEL_REPAIR_STEP] for j in await scene.jobs()] == [
            "reset",
            "validate",
        ]


async def test_a_reboot_waits_for_every_pod_of_the_node_to_be_evicted_pdbs_holding(
    scene_for: Callable[..., Any],
) -> None:
    """A pod that uses no GPU is in none of the controller's caches, yet the reboot takes it
    down: the ladder lists the node's pods and evicts it first, and a PDB that allows no
    disruption keeps the reboot waiting."""
    async with scene_for() as scene:
        core, ns = scene.core, scene.namespace
        body = {
            "metadata": {"name": "web-0", "labels": {"app": "web"}},
            "spec": {
                "nodeName": scene.node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "web", "image": "nginx:1"}],
            },
        }
        await core.create_namespaced_pod(ns, body)
        await eventually(lambda: _phase(core, ns, "web-0", "Running"), what="web-0 Running")
        policy = client.PolicyV1Api(core.api_client)
        pdb = {
            "metadata": {"name": "keep-web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        }
        await policy.create_namespaced_pod_disruption_budget(ns, pdb)
        await eventually(
            lambda: _pdb_allows(policy, ns, "keep-web", 0), what="the PDB computed: no disruption"
        )

        uuid = await scene.fault(0, "node_reboot")
        draining = await wait_for_event(core, "default", scene.node, "GpuRepairDraining")
        assert "evicting 1 pod(s) before the node's reboot" in draining.message
        loop = scene.ctl.controller.repair
        assert loop is not None
        after = loop.rounds + 4
        await eventually(lambda: _true(loop.rounds >= after), what="four more repair rounds")
        assert await _phase(core, ns, "web-0", "Running"), "the PDB holds it"
        assert await scene.jobs() == [], "no reboot while it is there"

        await policy.delete_namespaced_pod_disruption_budget("keep-web", ns)
        job = await scene.job_done("reboot")
        # The Job exists only once a listing of the node showed the pod gone.
        assert await _gone(core, ns, "web-0"), "evicted before the reboot"
        assert job.metadata.creation_timestamp >= draining.first_timestamp
        scene.exporter.fault(gpu=0, fault="clear")  # the reboot's effect
        await scene.ladder_done(uuid)


async def test_without_rbac_for_jobs_the_refusal_is_counted_told_once_and_nothing_crashes(
    scene_for: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async with scene_for(rbac=False) as scene:
        with caplog.at_level("INFO", logger="gpumon.controller.shell.repair_loop"):
            await scene.fault(0, "gpu_reset")
            (told,) = [await wait_for_event(scene.core, "default", scene.node, "GpuRepairJobsUnavailable")]
            assert "deploy/rbac/controller-repair.yaml" in told.message and "403" in told.message
            loop = scene.ctl.controller.repair
            assert loop is not None
            after = loop.rounds + 4
            await eventually(lambda: _true(loop.rounds >= after), what="four more repair rounds")
            async with aiohttp.ClientSession() as session:
                async with session.get(scene.ctl.url + "/metrics") as resp:
                    metrics = await resp.text()
                async with session.get(scene.ctl.url + "/healthz") as resp:
                    assert resp.status == 200, await resp.text()
        refused = [r for r in caplog.records if r.getMessage() == "repair Jobs unavailable"]
        assert len(refused) == 1, "logged once per outage"
        assert len(await scene.events("GpuRepairJobsUnavailable")) == 1
        counted = [
            line for line in metrics.splitlines() if line.startswith("gpumon_controller_repair_errors_total{")
        ]
        assert counted and all('error="KubeError"' in line for line in counted), counted
        assert 'gpumon_controller_task_restarts_total{task="repair"}' not in metrics, "nothing crashed"
        assert await scene.jobs() == []


async def _true(ok: bool) -> bool | None:
    return True if ok else None


async def _quarantined(core: client.CoreV1Api, node: str) -> bool | None:
    obj = await node_obj(core, node)
    return True if our_taint(obj) is not None else None


async def _phase(core: client.CoreV1Api, namespace: str, name: str, phase: str) -> bool | None:
    pod = await core.read_namespaced_pod(name, namespace)
    return True if pod.status.phase == phase and pod.metadata.deletion_timestamp is None else None


async def _gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, namespace)
    except client.ApiException as e:
        return e.status == 404
    return False


async def _pdb_allows(policy: client.PolicyV1Api, namespace: str, name: str, allowed: int) -> bool | None:
    pdb = await policy.read_namespaced_pod_disruption_budget(name, namespace)
    s = pdb.status
    ok = (
        s is not None
        and s.observed_generation == pdb.metadata.generation
        and s.disruptions_allowed == allowed
    )
    return True if ok else None

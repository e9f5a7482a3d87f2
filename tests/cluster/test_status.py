"""``gpumon status`` against the real control plane after a real quarantine: the controller (as
its shipped ServiceAccount) quarantines a node for fatal Xids on two GPUs, evicts the pod on one
and is refused by a PodDisruptionBudget on the other; status, run as a separate process the way
an operator would, names the rule, the GPUs, the evicted pod and the blocking PDB."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from controller_harness import (  # noqa: F401 - fixtures
    POOL_LABEL,
    TEST_LABEL,
    Scene,
    exporters,
    gpu_deployment,
    own_nodes,
    running_pods,
    sa_kubeconfig_for_fixture,
    scene_fixture,
    wait_for_event,
)
from kubernetes_asyncio import client

from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually


async def gpumon(*args: str) -> tuple[int, str, str]:
    # Wide: the tests' generated names would fold at 80 columns and hide the words looked for.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpumon.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "250"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def flat(text: str) -> str:
    """Table output with its line breaks and borders gone, for looking up words."""
    return " ".join(w for w in text.split() if w not in "│┃║|")


async def test_status_explains_a_real_quarantine(
    api: client.ApiClient, devcluster: DevCluster, scene: Scene, tmp_path: Path
) -> None:
    namespace, test_id = scene.namespace, scene.test_id
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    pool = f"pool-{test_id}"[:63]
    (bad,) = await scene.nodes(1, **{POOL_LABEL: pool})
    await apps.create_namespaced_deployment(namespace, gpu_deployment("train", 1, test_id))
    await apps.create_namespaced_deployment(namespace, gpu_deployment("serve", 1, test_id))
    pdb = {"minAvailable": 1, "selector": {"matchLabels": {"app": "serve"}}}
    await policy.create_namespaced_pod_disruption_budget(
        namespace, {"metadata": {"name": "keep-serve"}, "spec": pdb}
    )

    async def placed() -> tuple[Any, Any] | None:
        train, serve = (
            await running_pods(core, namespace, "train"),
            await running_pods(core, namespace, "serve"),
        )
        return (train[0], serve[0]) if len(train) == 1 and len(serve) == 1 else None

    train, serve = await eventually(placed, what="train and serve Running on the first node")

    async def pdb_settled() -> bool | None:
        pdb = await policy.read_namespaced_pod_disruption_budget("keep-serve", namespace)
        s = pdb.status
        ok = s is not None and s.observed_generation == pdb.metadata.generation and s.current_healthy == 1
        return True if ok and s.disruptions_allowed == 0 else None

    await eventually(pdb_settled, what="PDB keep-serve allows no disruption")
    (good,) = await scene.nodes(1, **{POOL_LABEL: pool})

    async with exporters([bad, good]) as ex:
        ex[bad].placement.pods = {0: (namespace, train.metadata.name), 1: (namespace, serve.metadata.name)}
        async with scene.controller(ex) as ctl:
            ex[bad].fault(gpu=0, fault="xid", code=79)
            ex[bad].fault(gpu=1, fault="xid", code=79)
            await wait_for_event(core, namespace, train.metadata.name, "GpuPodEvicted")
            await wait_for_event(core, "default", bad, "GpuEvictionBlocked")

            # What an operator runs: the admin kubeconfig, the controller's namespace and config.
            status_config = tmp_path / "controller.yaml"
            status_config.write_text(
                yaml.safe_dump({"signals": {"direct": {"endpoints": {bad: ex[bad].url}}}})
            )
            common = [
                "--kubeconfig", str(devcluster.kubeconfig),
                "--namespace", namespace,
                "--config", str(status_config),
                "--selector", f"{TEST_LABEL}={test_id}",
                "--controller-url", ctl.url,
            ]  # fmt: skip
            uuids = [ex[bad].uuid(0), ex[bad].uuid(1)]
            victim, held = f"{namespace}/{train.metadata.name}", f"{namespace}/{serve.metadata.name}"

            code, out, err = await gpumon("status", "--output", "json", *common)
            assert code == 0, err
            fleet = json.loads(out)
            (node,) = fleet["quarantined"]
            assert node["name"] == bad and node["pool"] == pool and node["taint"] == "NoSchedule"
            assert [(p["index"], p["uuid"], p["reason"], p["rules"]) for p in node["problems"]] == [
                (0, uuids[0], "XidFatal", ["xid-unhealthy"]),
                (1, uuids[1], "XidFatal", ["xid-unhealthy"]),
            ]
            assert node["evicted"] == [victim]
            (drain,) = fleet["drains"]
            assert drain["node"] == bad and drain["blockers"][0]["pod"] == held
            assert drain["blockers"][0]["pdbs"] == [f"{namespace}/keep-serve"]
            (pool_row,) = fleet["pools"]
            assert pool_row["quarantined"] == 1 and pool_row["breaker"] is None
            assert pool_row["gpus"] == {"healthy": 6, "degraded": 0, "unhealthy": 2, "lost": 0}
            ctl_view = fleet["controller"]
            assert ctl_view["reachable"] and ctl_view["leader"] and ctl_view["dry_run"] is False
            assert ctl_view["evictions"]["blocked"] >= 1

            code, out, err = await gpumon("status", *common)
            assert code == 0, err
            table = flat(out)
            for words in (
                bad,
                "XidFatal",
                "xid-unhealthy",
                "GPU 0",
                "GPU 1",
                train.metadata.name,
                "keep-serve",
            ):
                assert words in table, words

            code, out, err = await gpumon("status", "node", bad, "--output", "yaml", *common)
            assert code == 0, err
            why = yaml.safe_load(out)
            assert [p["uuid"] for p in why["node"]["problems"]] == uuids
            assert why["condition"]["reason"] == "XidFatal"
            reasons = [e["reason"] for e in why["timeline"]]
            assert {"GpuQuarantined", "GpuPodEvicted", "GpuEvictionBlocked"} <= set(reasons)
            assert reasons.index("GpuQuarantined") < reasons.index("GpuEvictionBlocked")
            (blocker,) = why["blockers"]
            assert blocker["pod"] == held and blocker["pdbs"] == [f"{namespace}/keep-serve"]
            signals = {g["index"]: g for g in why["signals"]}
            assert signals[0]["health"] == "unhealthy" and signals[0]["xids"] == {"79": 1}
            assert signals[3]["health"] == "healthy"
            assert any("xid-unhealthy" in line and "15m00s" in line for line in why["lift"])

            code, out, err = await gpumon("status", "node", bad, *common)
            assert code == 0, err
            table = flat(out)
            for words in ("What would lift the quarantine", "keep-serve", train.metadata.name, uuids[1]):
                assert words in table, words

            code, _, err = await gpumon("status", "node", "no-such-node", *common)
            assert code == 1 and "no node named 'no-such-node'" in err


async def test_watch_prints_a_document_per_round(
    devcluster: DevCluster, namespace: str, make_nodes: NodeMaker, test_id: str
) -> None:
    await make_nodes(1, own_nodes(test_id))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpumon.cli", "status", "--watch", "--interval", "0.2", "--output", "json",
        "--kubeconfig", str(devcluster.kubeconfig), "--namespace", namespace,
        "--selector", f"{TEST_LABEL}={test_id}", "--controller-url", "http://127.0.0.1:9",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        docs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) for _ in range(2)]
    finally:
        os.kill(proc.pid, signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
    assert docs[0]["taken_at"] <= docs[1]["taken_at"]
    for doc in docs:
        (pool,) = doc["pools"]
        assert pool["nodes"] == 1 and pool["gpus"]["healthy"] == 4
        assert doc["controller"]["reachable"] is False and doc["quarantined"] == []

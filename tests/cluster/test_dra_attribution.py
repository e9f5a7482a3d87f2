"""DRA pods attributed by the real exporter process on the real control plane: a Deployment asks
for GPUs through a ResourceClaimTemplate, the real kube-scheduler allocates each claim a device of
the node's ResourceSlice (devcluster's stand-in for NVIDIA's DRA driver, published with the
UUIDs of the node's simulated GPUs), the node's pod-resources fixture serves each pod the device
its claim got, and ``gpumon exporter`` (simulated GPUs with the same UUIDs, a host /proc naming
each GPU process's pod) reads the node's ResourceSlices from the API server and puts each pod's
memory and SM use on exactly the GPU or MIG device its claim holds. Two pods sharing one claim
split its GPU's use without counting it twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pod_objects
import pytest
import yaml
from kubernetes_asyncio import client
from metrics_text import Series, free_port, parse, select
from podresources_server import FakeKubelet, serve, short_socket_dir

from gpumon.devcluster import nodes, podresources_server, resourceslices, workloads
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually
from gpumon.k8s import dra
from gpumon.kube.client import KubeClient

TEST_LABEL = "test.gpumon.io/id"
MIB = 1 << 20
CONTAINER = "cuda"


def _template(test_id: str, gpus: int, **kw: Any) -> nodes.NodeTemplate:
    return nodes.NodeTemplate(gpus=gpus, dra=True, labels={TEST_LABEL: test_id}, **kw)


def _shared_claim(name: str) -> dict[str, Any]:
    """A ResourceClaim of one whole GPU, for pods to name directly (and so share)."""
    spec = workloads.claim_template(name, resourceslices.GPU_DEVICE_CLASS)["spec"]["spec"]
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}


def _sharing_deployment(
    name: str, claim: str, replicas: int, node_selector: Mapping[str, str]
) -> dict[str, Any]:
    body = workloads.dra_deployment(
        name, replicas=replicas, claim_template_name=claim, node_selector=node_selector
    )
    [entry] = body["spec"]["template"]["spec"]["resourceClaims"]
    entry["resourceClaimName"] = entry.pop("resourceClaimTemplateName")  # the claim itself, shared
    return body


async def _running(
    api: client.ApiClient, namespace: str, app: str, count: int
) -> tuple[list[dict[str, Any]], dict[dra.ClaimRef, dict[str, Any]]]:
    """The app's ``count`` pods once bound, Running and each claim allocated, with the claims."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

    async def ready() -> tuple[list[dict[str, Any]], dict[dra.ClaimRef, dict[str, Any]]] | None:
        listed = (await core.list_namespaced_pod(namespace, label_selector=f"app={app}")).items
        pods = [api.sanitize_for_serialization(p) for p in listed if p.status.phase == "Running"]
        claims = {
            dra.ClaimRef(namespace, c.metadata.name): api.sanitize_for_serialization(c)
            for c in (await resource.list_namespaced_resource_claim(namespace)).items
        }
        done = [
            p
            for p in pods
            if (refs := dra.pod_claims(p)) and all(dra.claim_devices(claims.get(r, {})) for r in refs)
        ]
        return (done, claims) if len(done) == count else None

    found: tuple[list[dict[str, Any]], dict[dra.ClaimRef, dict[str, Any]]] = await eventually(
        ready, what=f"{count} pods of {app} Running with allocated claims", timeout_seconds=90
    )
    return found


class Node:
    """A DRA node: its slice's devices by reference and its simulated GPUs' MIG instances by UUID."""

    def __init__(
        self, name: str, template: nodes.NodeTemplate, slice_devices: Sequence[dra.SliceDevice]
    ) -> None:
        self.name = name
        self.template = template
        self.devices = {d.ref: d for d in slice_devices}
        backend = resourceslices.simulated_backend(name, template)
        backend.open()
        try:
            self.gpu_index = {g.uuid: g.index for g in backend.devices()}
            instances = {g.index: backend.read_slow(g.index).mig_instances for g in backend.devices()}
        finally:
            backend.close()
        self.mig = {m.uuid: m for ms in instances.values() for m in ms}
        # The MIG layout for an exporter's scenario: the same instances, so the same UUIDs.
        self.mig_layout = [
            {"gpu": i, "profiles": [m.profile for m in ms]} for i, ms in instances.items() if ms
        ]


async def _node(api: client.ApiClient, make_nodes: NodeMaker, template: nodes.NodeTemplate) -> Node:
    (name,) = await make_nodes(1, template)
    slices = (await client.ResourceV1Api(api).list_resource_slice()).items
    devices = [
        d
        for s in slices
        if s.spec.node_name == name
        for d in dra.slice_devices(api.sanitize_for_serialization(s))
    ]
    return Node(name, template, devices)


class Workload:
    """Each pod's one GPU process (pid, MiB, SM share) and what its claim holds; the node's
    host /proc naming each process's pod."""

    def __init__(self, host_proc: Path) -> None:
        self.host_proc = host_proc
        self.processes: list[dict[str, Any]] = []
        self.pods: dict[str, tuple[dra.ClaimRef, dra.SliceDevice, int, float]] = {}

    async def start(
        self,
        core: client.CoreV1Api,
        node: Node,
        pods: Sequence[dict[str, Any]],
        claims: Mapping[dra.ClaimRef, dict[str, Any]],
    ) -> None:
        for p in pods:
            pid = 5000 + len(self.processes)
            mib, sm = 1000 * (len(self.processes) + 1), round(0.1 * (len(self.processes) + 1), 2)
            [ref] = dra.pod_claims(p)
            [allocated] = dra.claim_devices(claims[ref])
            device = node.devices[allocated.ref]
            assert device.card_uuid is not None and device.uuid is not None
            running = await pod_objects.running_pod(core, p["metadata"]["namespace"], p)
            running.write_process(self.host_proc, pid, CONTAINER)
            process = {
                "gpu": node.gpu_index[device.card_uuid],
                "pid": pid,
                "used_memory_mib": mib,
                "sm_share": sm,
            }
            if device.kind == dra.MIG_TYPE:
                process["gpu_instance"] = node.mig[device.uuid].gpu_instance
            self.processes.append(process)
            self.pods[p["metadata"]["name"]] = (ref, device, mib, sm)


@contextlib.contextmanager
def _exporter(cluster: DevCluster, node: Node, workload: Workload, work: Path) -> Iterator[str]:
    """``gpumon exporter`` on the node's simulated GPUs (the UUIDs its slice publishes) running
    ``workload``'s processes, its pod-resources what the node's kubelet would list; its URL."""
    scenario = work / f"{node.name}.scenario.yaml"
    scenario.write_text(yaml.safe_dump({"processes": workload.processes, "mig": node.mig_layout}))
    port = free_port()
    argv = [
        sys.executable, "-m", "gpumon.cli", "exporter", "--backend", "simulated",
        "--simulate-gpus", str(node.template.gpus),
        "--simulate-model", node.template.product.removeprefix("NVIDIA-"),
        "--simulate-seed", str(resourceslices.simulation_seed(node.name)), "--scenario", str(scenario),
        "--node-name", node.name, "--listen-address", "127.0.0.1", "--port", str(port),
        "--fast-interval", "0.5", "--slow-interval", "1",
    ]  # fmt: skip
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "GPUMON_PODS__HOST_PROC": str(workload.host_proc),
        "GPUMON_PODS__POD_RESOURCES_SOCKET": str(work / "kubelet.sock"),
    }
    with (work / f"{node.name}.log").open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return parse(resp.read().decode())


async def _until(url: str, condition: Any, what: str) -> Series:
    last: Series = {}

    async def check() -> Series | None:
        nonlocal last
        try:
            last = await asyncio.to_thread(_scrape, url)
        except OSError:
            return None
        return last if condition(last) else None

    def seen() -> object:  # the pods' and the sources' series, for the message
        return sorted(
            (n, sorted(ls), v)
            for (n, ls), v in last.items()
            if n.startswith(("gpumon_pod_", "gpumon_exporter_pod_", "gpumon_exporter_dra"))
        )

    found: Series = await eventually(check, what=what, timeout_seconds=90, interval_seconds=0.2, seen=seen)
    return found


def _by_pod(series: Series, name: str, namespace: str) -> dict[str, dict[str, str]]:
    """The labels of each pod's one ``name`` series."""
    out: dict[str, dict[str, str]] = {}
    for labels in select(series, name, namespace=namespace):
        d = dict(labels)
        assert d["pod"] not in out, f"{d['pod']} has more than one {name} series"
        out[d["pod"]] = d
    return out


def _all_used(series: Series, namespace: str, workload: Workload) -> bool:
    """Every pod of the workload has its memory series, each counting its process."""
    used = select(series, "gpumon_pod_gpu_memory_used_bytes", namespace=namespace)
    return {dict(k)["pod"] for k in used} == set(workload.pods) and all(used.values())


def _check(series: Series, namespace: str, node: Node, workload: Workload) -> None:
    """Each pod's memory and SM use on exactly the GPU or MIG device its claim holds, its claim
    in the info series, and dcgm's DRA labels where one pod holds the device."""
    used = _by_pod(series, "gpumon_pod_gpu_memory_used_bytes", namespace)
    assert set(used) == set(workload.pods)
    for pod, (ref, device, mib, sm) in workload.pods.items():
        labels = used[pod]
        assert labels["container"] == CONTAINER and labels["uuid"] == device.uuid
        assert labels["gpu"] == str(node.gpu_index[device.card_uuid or ""])
        if device.kind == dra.MIG_TYPE:
            m = node.mig[device.uuid or ""]
            assert (labels["gpu_instance"], labels["compute_instance"], labels["mig_profile"]) == (
                str(m.gpu_instance),
                str(m.compute_instance),
                device.profile,
            )
        else:
            assert "gpu_instance" not in labels
        assert series[("gpumon_pod_gpu_memory_used_bytes", frozenset(labels.items()))] == mib * MIB
        assert series[("gpumon_pod_gpu_utilization_ratio", frozenset(labels.items()))] == pytest.approx(sm)
        allocated = {**labels, "resource": dra.NVIDIA_GPU_DRIVER}
        assert series[("gpumon_pod_gpu_allocated", frozenset(allocated.items()))] == 1.0
        info = {
            **labels,
            "claim_namespace": ref.namespace,
            "claim_name": ref.name,
            "driver": device.ref.driver,
            "pool": device.ref.pool,
            "device": device.ref.device,
        }
        assert select(series, "gpumon_pod_dra_claim_info", pod=pod) == {frozenset(info.items()): 1.0}
    assert select(series, "gpumon_exporter_pod_source_state", source="dra", state="up") == {
        frozenset({("source", "dra"), ("state", "up")}): 1.0
    }
    assert not select(series, "gpumon_exporter_pod_source_errors_total", source="dra")
    assert select(series, "gpumon_exporter_dra_unresolved_devices") == {frozenset(): 0.0}


async def test_dra_pods_use_is_on_the_gpu_or_mig_device_their_claims_hold(
    api: client.ApiClient,
    kube: KubeClient,
    devcluster: DevCluster,
    namespace: str,
    make_nodes: NodeMaker,
    test_id: str,
    tmp_path: Path,
) -> None:
    core, resource, apps = client.CoreV1Api(api), client.ResourceV1Api(api), client.AppsV1Api(api)
    whole = await _node(api, make_nodes, _template(f"{test_id}w", 3))
    mig = await _node(api, make_nodes, _template(f"{test_id}m", 1, mig={"3g.40gb": 2}))

    # Two pods with a GPU each from a template, two sharing one claim's GPU; two pods with a
    # 3g.40gb MIG device each.
    await resource.create_namespaced_resource_claim_template(
        namespace, workloads.claim_template("one-gpu", resourceslices.GPU_DEVICE_CLASS)
    )
    await resource.create_namespaced_resource_claim(namespace, _shared_claim("shared-gpu"))
    selector = f"device.attributes['{dra.NVIDIA_GPU_DRIVER}'].profile == '3g.40gb'"
    await resource.create_namespaced_resource_claim_template(
        namespace, workloads.claim_template("half-gpu", resourceslices.MIG_DEVICE_CLASS, selectors=[selector])
    )
    on_whole, on_mig = {TEST_LABEL: f"{test_id}w"}, {TEST_LABEL: f"{test_id}m"}
    for body in (
        workloads.dra_deployment("train", replicas=2, claim_template_name="one-gpu", node_selector=on_whole),
        _sharing_deployment("pair", "shared-gpu", 2, on_whole),
        workloads.dra_deployment("infer", replicas=2, claim_template_name="half-gpu", node_selector=on_mig),
    ):
        await apps.create_namespaced_deployment(namespace, body)

    loads = {n.name: Workload(tmp_path / n.name / "proc") for n in (whole, mig)}
    for app, node in (("train", whole), ("pair", whole), ("infer", mig)):
        pods, claims = await _running(api, namespace, app, 2)
        assert {p["spec"]["nodeName"] for p in pods} == {node.name}
        await loads[node.name].start(core, node, pods, claims)
    pair = [n for n in loads[whole.name].pods if n.startswith("pair-")]
    assert len({loads[whole.name].pods[n][1].ref for n in pair}) == 1  # one device, shared
    # Three distinct GPUs on the whole node, two distinct MIG devices of the one GPU.
    assert len({d.ref for _, d, _, _ in loads[whole.name].pods.values()}) == 3
    assert len({d.uuid for _, d, _, _ in loads[mig.name].pods.values()}) == 2

    for node in (whole, mig):
        with short_socket_dir() as work:
            kubelet = FakeKubelet()
            kubelet.pods = await podresources_server.node_pods(kube, node.name)
            workload = loads[node.name]
            with (
                serve(work / "kubelet.sock", kubelet),
                _exporter(devcluster, node, workload, work) as url,
            ):
                series = await _until(
                    url, lambda s, w=workload: _all_used(s, namespace, w), f"the DRA pods' use on {node.name}"
                )
                _check(series, namespace, node, workload)

                if node is whole:
                    # The shared claim's GPU: each pod its own process, the card's use counted once.
                    [shared] = {workload.pods[n][1].uuid or "" for n in pair}
                    card = str(whole.gpu_index[shared])
                    on_card = select(series, "gpumon_pod_gpu_memory_used_bytes", gpu=card)
                    assert {dict(k)["pod"] for k in on_card} == set(pair)
                    card_used = select(series, "gpumon_gpu_memory_used_bytes", gpu=card)
                    assert sum(on_card.values()) == sum(workload.pods[n][2] for n in pair) * MIB
                    assert sum(on_card.values()) <= sum(card_used.values())

"""``python -m bench autoscalers``: gpumon scaling a Cluster API pool beside Karpenter scaling a
NodePool, given the same pending GPU pods, on one local control plane (issue #28, section 4).

Setups, side by side for each workload (started at the same moment, measured apart):

- ``capi``: gpumon's controller (``gpumon controller --act``, a subprocess) autoscaling a
  MachineDeployment that Cluster API v1.13.6's own core manager reconciles; the devcluster's
  kwok infrastructure provider turns each Machine into a kwok Node of the pool's template;
- ``karpenter``: Karpenter v1.15.0 with its kwok cloud provider, a NodePool offering one
  instance type of exactly the same shape, Karpenter's defaults (DRA requests ignored);
- ``karpenter-dra`` (the DRA workload only, after the others): Karpenter restarted with
  ``--ignore-dra-requests=false``, and its kwok DRA driver given the same devices (on v1.15.0
  it publishes none: it cannot list its DRAConfigs, see :func:`driver_check`).

Workloads (:data:`WORKLOADS`): whole GPUs, gpushare memory, cGPU core share with memory, a MIG
profile, DRA claims with a CEL selector. A few nodes each: the machine has 2 shared cores.

For DRA nodes of the first two setups a stand-in of NVIDIA's DRA kubelet plugin publishes each
new node's ResourceSlice (:func:`gpumon.devcluster.resourceslices.publish`), whoever launched it.

Pure parts (what a workload needs, what a setup did with it) are tested in
tests/unit/test_bench_autoscalers.py; the rest talks to the cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.controller_scale import create, ready
from bench.report import Grid, section_markdown, splice
from bench.run import cpu_model, load_average, log
from gpumon.devcluster import capi, cluster_api, karpenter, nodes, resourceslices, workloads
from gpumon.devcluster.binaries import (
    Karpenter,
    ToolsMissing,
    locate,
    locate_cluster_api,
    locate_karpenter,
)
from gpumon.devcluster.cluster import DevCluster, free_ports
from gpumon.devcluster.components import Component, HealthCheck
from gpumon.k8s import dra
from gpumon.kube.client import KubeApi, NotFound, connected

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "autoscalers"
POOL_LABEL = "bench.gpumon.io/pool"  # on every node a setup launches: "<setup>-<workload>"
DEADLINE_SECONDS = 180.0
POLL_SECONDS = 0.5
DRA_DEVICES = "DRA devices"  # what a DRA pod asks of a node, in the pure sums below
CAPI, KARPENTER, KARPENTER_DRA = "capi", "karpenter", "karpenter-dra"
SETUP_TITLES = {
    CAPI: "gpumon + Cluster API",
    KARPENTER: "Karpenter (defaults)",
    KARPENTER_DRA: "Karpenter, IGNORE_DRA_REQUESTS=false",
}
PER_CARD = frozenset({nodes.SHARED_GPU_MEMORY, nodes.SHARED_GPU_CORE})  # must fit on one GPU


# -- the workloads and what they need (pure) ----------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    template: nodes.NodeTemplate  # the CAPI pool's node template = the Karpenter instance type
    instance_type: str
    pods: int
    limits: Mapping[str, str] = field(default_factory=dict)  # device-plugin resources per pod
    claim: Mapping[str, Any] | None = None  # workloads.claim_template's keywords, one claim per pod

    def ask(self) -> dict[str, int]:
        """What one pod takes of a node, in whole units (a DRA claim: its device count)."""
        out = {k: int(v) for k, v in self.limits.items()}
        if self.claim is not None:
            out[DRA_DEVICES] = int(self.claim.get("count", 1))
        return out


def capacity(template: nodes.NodeTemplate) -> tuple[dict[str, int], dict[str, int]]:
    """(what each GPU of the node offers of the per-card resources, what the node offers in
    all): gpushare memory and cGPU core share must fit on one card; whole GPUs, MIG instances
    and DRA devices are counted per node."""
    per_card: dict[str, int] = {}
    if template.shared is not None:
        per_card = {nodes.SHARED_GPU_MEMORY: template.shared.memory_gib_per_gpu, nodes.SHARED_GPU_CORE: 100}
    flat = {k: int(v) for k, v in nodes.gpu_resources(template).items() if k not in PER_CARD}
    if template.dra:
        flat[DRA_DEVICES] = len(resourceslices.devices("template", template))
    flat["pods"] = int(template.pods)
    return per_card, flat


def pods_per_node(template: nodes.NodeTemplate, ask: Mapping[str, int]) -> int:
    """How many pods asking ``ask`` one node of ``template`` holds, each per-card ask on one
    card. 0 when the node cannot hold one."""
    per_card, flat = capacity(template)
    counts = [flat.get(k, 0) // v for k, v in ask.items() if k not in PER_CARD and v > 0]
    counts.append(flat["pods"])
    on_card = {k: v for k, v in ask.items() if k in PER_CARD and v > 0}
    if on_card:
        per_gpu = min(per_card.get(k, 0) // v for k, v in on_card.items())
        counts.append(per_gpu * template.gpu_count)
    return min(counts)


def nodes_needed(w: Workload) -> int:
    """The fewest nodes of the workload's shape that run all its pods."""
    per_node = pods_per_node(w.template, w.ask())
    if per_node == 0:
        raise ValueError(f"{w.name}: one node of its shape cannot hold one of its pods")
    return math.ceil(w.pods / per_node)


def gpus_beyond_need(launched_nodes: int, needed_nodes: int, gpus_per_node: int) -> int:
    """GPUs on the nodes launched past the fewest that run every pod (0 when too few)."""
    return max(0, launched_nodes - needed_nodes) * gpus_per_node


def unheld(pods: int, launched_nodes: int, per_node: int) -> int:
    """Pods the launched nodes cannot hold, counting per-card asks per card (0 when they hold
    all): for gpushare and cGPU, those Kubernetes runs anyway since it sums the node's cards."""
    return max(0, pods - launched_nodes * per_node)


def verdict(
    *, launched: int, needed: int, per_node: int, running: int, pods: int, per_card: bool = False
) -> str:
    """What a setup did with the workload, in a few words."""
    if launched == 0 and running < pods:
        return "nothing: no node launched"
    words = []
    if launched > needed:
        words.append(f"too much: {launched - needed} node(s) more than needed")
    elif launched < needed:
        words.append(f"too little: {needed - launched} node(s) short")
    over = min(running, unheld(pods, launched, per_node)) if per_card else 0
    if over:
        words.append(
            f"{over} pod(s) Running only because Kubernetes sums the node's cards: no GPU of the "
            "launched nodes holds them"
        )
    if running < pods:
        words.append(f"{pods - running} pod(s) left Pending")
    return "; ".join(words) or "as needed"


A100 = "NVIDIA-A100-SXM4-80GB"
T4 = "Tesla-T4"
BIG_GPU = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
SHARED_T4 = nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(4, 16), product=T4)
WORKLOADS = (
    Workload("whole", "whole GPUs: 4 pods x 3 nvidia.com/gpu", nodes.NodeTemplate(gpus=8), "gpu-8x-a100", 4,
             {nodes.GPU: "3"}),
    Workload("gpushare", "gpushare: 6 pods x 10 GiB aliyun.com/gpu-mem", SHARED_T4, "share-4x-t4", 6,
             {nodes.SHARED_GPU_MEMORY: "10"}),
    Workload("cgpu", "cGPU: 10 pods x (50 % aliyun.com/gpu-core.percentage, 4 GiB gpu-mem)", SHARED_T4,
             "share-4x-t4", 10, {nodes.SHARED_GPU_CORE: "50", nodes.SHARED_GPU_MEMORY: "4"}),
    Workload("mig", "MIG: 7 pods x 1 nvidia.com/mig-3g.40gb", nodes.NodeTemplate(gpus=2, mig={"3g.40gb": 2}),
             "mig-2x-a100", 7, {"nvidia.com/mig-3g.40gb": "1"}),
    Workload("dra", "DRA: 10 pods x 1 gpu.nvidia.com device, CEL memory >= 40Gi",
             nodes.NodeTemplate(gpus=8, dra=True), "dra-8x-a100", 10,
             claim={"device_class": resourceslices.GPU_DEVICE_CLASS, "selectors": [BIG_GPU]}),
)  # fmt: skip


def instance_types() -> tuple[karpenter.InstanceType, ...]:
    """One instance type per node shape, as Karpenter's kwok provider offers it."""
    seen: dict[str, karpenter.InstanceType] = {}
    for w in WORKLOADS:
        seen.setdefault(w.instance_type, karpenter.InstanceType(w.instance_type, w.template))
    return tuple(seen.values())


def pool_value(setup: str, w: Workload) -> str:
    return f"{setup}-{w.name}"


def gpumon_pool(w: Workload, namespace: str) -> dict[str, Any]:
    """gpumon's pool over the workload's MachineDeployment, its template the same node shape;
    every other setting at its default (docs/autoscaling.md) but the bound max_replicas."""
    name = pool_value(CAPI, w)
    labels = {POOL_LABEL: name}
    template: dict[str, Any]
    if w.template.shared is not None:
        s = w.template.shared
        template = {
            "shared_gpus": {"cards": s.gpus, "memory_per_card": s.memory_gib_per_gpu},
            "labels": labels,
        }
    elif w.template.dra:
        template = {"labels": labels, "dra": resourceslices.pool_dra(w.template)}
    else:
        template = {"resources": nodes.gpu_resources(w.template), "labels": labels}
    return {
        "name": name,
        "target": {"namespace": namespace, "name": name},
        "node_selector": f"{POOL_LABEL}={name}",
        "template": template,
        "max_replicas": 6,
    }


# -- one setup's run ----------------------------------------------------------------------------


@dataclass
class Outcome:
    setup: str
    workload: Workload
    launched: int = 0
    running: int = 0
    pending: int = 0
    seconds: float | None = None  # to all Running; None: not by the deadline
    events: list[str] = field(default_factory=list)  # what was said of the pods left Pending
    karpenter_said: list[str] = field(default_factory=list)  # of every pod, by Karpenter
    karpenter_logged: list[str] = field(default_factory=list)  # its log lines on the namespace
    driver_check: str = ""  # what Karpenter's kwok DRA driver did for a node made by hand

    @property
    def needed(self) -> int:
        return nodes_needed(self.workload)

    def row(self) -> tuple[str, ...]:
        w = self.workload
        took = f"{self.seconds:.1f} s" if self.seconds is not None else f"not all by {DEADLINE_SECONDS:.0f} s"
        return (
            w.title,
            SETUP_TITLES[self.setup],
            f"{self.launched} (need {self.needed})",
            f"{self.running}/{w.pods}",
            str(self.pending),
            str(gpus_beyond_need(self.launched, self.needed, w.template.gpu_count)),
            took,
            verdict(
                launched=self.launched,
                needed=self.needed,
                per_node=pods_per_node(w.template, w.ask()),
                running=self.running,
                pods=w.pods,
                per_card=w.template.shared is not None,
            ),
        )


def namespace_of(setup: str) -> str:
    return f"bench-{setup}"


async def start_workload(api: KubeApi, setup: str, w: Workload) -> None:
    ns = namespace_of(setup)
    selector = {POOL_LABEL: pool_value(setup, w)}
    if w.claim is not None:
        await create(
            api,
            f"/apis/{dra.API_VERSION}/namespaces/{ns}/resourceclaimtemplates",
            workloads.claim_template(w.name, **w.claim),
        )
        body = workloads.dra_deployment(
            w.name, replicas=w.pods, claim_template_name=w.name, node_selector=selector
        )
    else:
        body = workloads.gpu_deployment(w.name, replicas=w.pods, limits=w.limits, node_selector=selector)
    await create(api, f"/apis/apps/v1/namespaces/{ns}/deployments", body)


async def pods_of(api: KubeApi, setup: str, w: Workload) -> list[Mapping[str, Any]]:
    listed = await api.get(
        f"/api/v1/namespaces/{namespace_of(setup)}/pods", {"labelSelector": f"{workloads.APP_LABEL}={w.name}"}
    )
    return [p for p in listed.get("items") or () if not p["metadata"].get("deletionTimestamp")]


async def nodes_of(api: KubeApi, setup: str, w: Workload) -> list[Mapping[str, Any]]:
    listed = await api.get("/api/v1/nodes", {"labelSelector": f"{POOL_LABEL}={pool_value(setup, w)}"})
    return list(listed.get("items") or ())


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def logged(path: Path, namespace: str, limit: int = 4) -> list[str]:
    """Karpenter's distinct log messages (with their error) that name ``namespace``."""
    seen: dict[str, None] = {}
    if not path.exists():
        return []
    for line in path.read_text(errors="replace").splitlines():
        if namespace not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        text = f"{doc.get('message', '')}: {without_other_pools(str(doc.get('error') or ''))}".rstrip(": ")
        seen[text[:300]] = None
    return list(seen)[-limit:]


async def measure(api: KubeApi, setup: str, w: Workload, log_path: Path | None = None) -> Outcome:
    """Create the workload's pods, wait until all are Running or the deadline, and read what
    the setup launched and what was said of the pods left Pending."""
    out = Outcome(setup, w)
    started = time.monotonic()
    await start_workload(api, setup, w)
    while time.monotonic() - started < DEADLINE_SECONDS:
        pods = await pods_of(api, setup, w)
        if len(pods) == w.pods and all(map(_running, pods)):
            out.seconds = time.monotonic() - started
            break
        await asyncio.sleep(POLL_SECONDS)
    log(f"{setup}/{w.name}: " + (f"all Running in {out.seconds:.1f} s" if out.seconds else "deadline"))
    pods = await pods_of(api, setup, w)
    launched = await nodes_of(api, setup, w)
    out.launched = len(launched)
    out.running = sum(map(_running, pods))
    out.pending = len(pods) - out.running
    out.events, out.karpenter_said = await said(api, setup, pods)
    if log_path is not None and out.pending:
        out.karpenter_logged = logged(log_path, namespace_of(setup))
    return out


OTHER_POOLS = f"incompatible requirements, key {POOL_LABEL},"


def without_other_pools(text: str) -> str:
    """Karpenter's reasons for not scheduling a pod, one clause per NodePool, less those on the
    other setups' NodePools (whose pool label the pod does not select), counted instead."""
    text = " ".join(text.split())
    head = next((h for h in ("Failed to schedule pod, ",) if text.startswith(h)), "")
    clauses = text.removeprefix(head).split("; ")
    kept = [c for c in clauses if not c.startswith(OTHER_POOLS)]
    if len(kept) == len(clauses):
        return text
    return head + "; ".join([*kept, f"[{len(clauses) - len(kept)} on the other setups' NodePools left out]"])


def _event_line(e: Mapping[str, Any]) -> str:
    """An Event as one line (Karpenter's without the clauses on other NodePools)."""
    source = e.get("reportingComponent") or (e.get("source") or {}).get("component") or "?"
    message = without_other_pools(str(e.get("message") or ""))
    if len(message) > 400:
        message = message[:400] + " …"
    return f"{source} {e.get('reason')}: {message}"


async def said(api: KubeApi, setup: str, pods: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(the latest Events of each kind on the pods left Pending, whoever wrote them but the
    other setup's autoscaler; everything Karpenter said of these pods), distinct lines."""
    listed = await api.get(f"/api/v1/namespaces/{namespace_of(setup)}/events")
    names = {p["metadata"]["name"] for p in pods}
    pending = {p["metadata"]["name"] for p in pods if not _running(p)}
    other = "karpenter" if setup == CAPI else "gpumon"
    pending_lines: dict[str, str] = {}
    karpenter_lines: dict[str, str] = {}
    for e in listed.get("items") or ():
        name = (e.get("involvedObject") or {}).get("name")
        line = _event_line(e)
        if name in pending and not line.startswith(other):
            pending_lines[line.split(":")[0]] = line  # the last one of each source and reason
        if name in names and line.startswith("karpenter"):
            karpenter_lines[line.split(":")[0]] = line
    return sorted(pending_lines.values()), sorted(karpenter_lines.values())


# -- the setups ---------------------------------------------------------------------------------


def controller_component(cluster: DevCluster, root: Path, port: int) -> Component:
    """gpumon's controller as its command runs it, acting, with one pool per workload."""
    namespace = namespace_of(CAPI)
    config = {
        "kubeconfig": str(cluster.kubeconfig),
        "namespace": namespace,
        "identity": "bench",
        "listen_address": "127.0.0.1",
        "port": port,
        "node_selector": POOL_LABEL,
        "signals": {"source": "direct", "direct": {"endpoints": {}}},
        "pools": [gpumon_pool(w, namespace) for w in WORKLOADS],
    }
    path = root / "gpumon-controller.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Component(
        name="gpumon-controller",
        argv=(str(Path(sys.executable).with_name("gpumon")), "controller", f"--config={path}", "--act"),
        health=HealthCheck(f"http://127.0.0.1:{port}/healthz", client_cert=False),
        wave=0,
    )


def apply(cluster: DevCluster, path: Path, docs: Sequence[Mapping[str, Any]]) -> None:
    path.write_text(yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False))
    cluster.kubectl("apply", "--server-side", "--field-manager=gpumon-bench", "-f", str(path))


def capi_setup(cluster: DevCluster, root: Path) -> None:
    """Cluster API's manager, a Cluster, one MachineDeployment per workload at 0 replicas, and
    gpumon's controller over them."""
    running = cluster_api.start(cluster, locate_cluster_api())
    ns = namespace_of(CAPI)
    docs: list[Mapping[str, Any]] = list(capi.management_cluster(ns, running.kubeconfig_yaml))
    for w in WORKLOADS:
        name = pool_value(CAPI, w)
        docs += capi.machine_pool(name, ns, nodes.shape(w.template, {POOL_LABEL: name}), replicas=0)
    apply(cluster, root / "capi.yaml", docs)
    cluster.add_components([controller_component(cluster, root, free_ports(1)[0])])


def node_pools(setup: str) -> list[dict[str, Any]]:
    return [
        karpenter.node_pool(
            pool_value(setup, w), [w.instance_type], labels={POOL_LABEL: pool_value(setup, w)}
        )
        for w in WORKLOADS
        if setup != KARPENTER_DRA or w.claim is not None
    ]


async def publish_slices(
    api: KubeApi, values: Sequence[str], templates: Mapping[str, nodes.NodeTemplate]
) -> None:
    """NVIDIA's DRA kubelet plugin, played: each new node of a DRA pool publishes its slice."""
    done: set[str] = set()
    selector = f"{POOL_LABEL} in ({','.join(values)})"
    while True:
        listed = await api.get("/api/v1/nodes", {"labelSelector": selector})
        for node in listed.get("items") or ():
            name = node["metadata"]["name"]
            if name not in done and ready(node):
                try:
                    await resourceslices.publish(api, name, templates[node["metadata"]["labels"][POOL_LABEL]])
                    done.add(name)
                except NotFound:
                    pass
        await asyncio.sleep(POLL_SECONDS)


def logged_errors(path: Path, limit: int = 2) -> list[str]:
    """The distinct ``error`` fields of a controller-runtime development log's ERROR lines."""
    seen: dict[str, None] = {}
    for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
        if "\tERROR\t" in line and "{" in line:
            try:
                fields = json.loads(line[line.index("{") :])
            except ValueError:
                continue
            columns = line.split("\t")
            what = columns[3] if len(columns) > 4 else ""
            seen[f"{what}: {fields.get('error', '')}"] = None
    return list(seen)[:limit]


async def driver_check(api: KubeApi, w: Workload, log_path: Path, seconds: float = 60.0) -> str:
    """Karpenter's kwok DRA driver at work: a kwok node of the DRA shape made by hand with the
    pool's label (Karpenter launched none) gets its ResourceSlice from the driver, and the pods
    left Pending land on it; what happened, in a sentence."""
    name = f"bench-{pool_value(KARPENTER_DRA, w)}-by-hand"
    body = nodes.manifest(name, w.template, extra_labels={POOL_LABEL: pool_value(KARPENTER_DRA, w)})
    started = time.monotonic()
    await create(api, "/api/v1/nodes", body)
    sliced: float | None = None
    running = 0
    while time.monotonic() - started < seconds:
        if sliced is None:
            slices = (await api.get(dra.RESOURCE_SLICES_PATH)).get("items") or ()
            if any((s.get("spec") or {}).get("nodeName") == name for s in slices):
                sliced = time.monotonic() - started
        running = sum(map(_running, await pods_of(api, KARPENTER_DRA, w)))
        if sliced is not None and running >= min(w.pods, pods_per_node(w.template, w.ask())):
            break
        await asyncio.sleep(POLL_SECONDS)
    took = time.monotonic() - started
    if sliced is None:
        errors = "; ".join(logged_errors(log_path)) or "none"
        return (
            f"a node of the shape made by hand got no ResourceSlice from the driver in {seconds:.0f} s "
            f"(the driver's errors: {errors})"
        )
    return (
        f"a node of the shape made by hand got its ResourceSlice from the driver {sliced:.1f} s after "
        f"it was created, and {running} of the {w.pods} pods were Running on it {took:.1f} s after"
    )


def dra_config_crd(tools: Karpenter) -> Path:
    """The DRAConfig CRD, which hack/build-tools.sh copies beside Karpenter's own."""
    name = f"{karpenter.DRA_CONFIG_GROUP}_{karpenter.DRA_CONFIGS}.yaml"
    for path in tools.crds:
        if path.name == name:
            return path
    raise ToolsMissing(f"Karpenter's tools lack the DRAConfig CRD {name}; run `make setup`")


def dra_driver_config(w: Workload) -> dict[str, Any]:
    """The kwok DRA driver's config: the same devices NVIDIA's plugin would publish."""
    devices = resourceslices.devices("template", w.template)
    return karpenter.dra_config(
        "bench-gpu", dra.NVIDIA_GPU_DRIVER, {POOL_LABEL: pool_value(KARPENTER_DRA, w)}, devices
    )


async def run_all(cluster: DevCluster, root: Path) -> list[Outcome]:
    outcomes: list[Outcome] = []
    tools = locate_karpenter()
    for setup in (CAPI, KARPENTER, KARPENTER_DRA):
        cluster.kubectl("create", "namespace", namespace_of(setup))
    log("starting Cluster API's manager and gpumon's controller")
    capi_setup(cluster, root)
    log("starting Karpenter")
    karpenter.start(cluster, instance_types(), tools)
    async with connected(cluster.kubeconfig) as api:
        for body in node_pools(KARPENTER):
            await create(api, f"/apis/{karpenter.GROUP}/{karpenter.VERSION}/{karpenter.NODE_POOLS}", body)
        dra_templates = {
            pool_value(s, w): w.template for s in (CAPI, KARPENTER) for w in WORKLOADS if w.claim
        }
        publisher = asyncio.create_task(publish_slices(api, sorted(dra_templates), dra_templates))
        try:
            for w in WORKLOADS:
                log(f"workload {w.name}: both setups")
                outcomes += await asyncio.gather(
                    measure(api, CAPI, w), measure(api, KARPENTER, w, cluster.layout.logs / "karpenter.log")
                )
            # The DRA pods Karpenter left must not reach the next Karpenter.
            dra_workload = next(w for w in WORKLOADS if w.claim is not None)
            await api.delete(
                f"/apis/apps/v1/namespaces/{namespace_of(KARPENTER)}/deployments/{dra_workload.name}"
            )
            log("restarting Karpenter with IGNORE_DRA_REQUESTS=false, and its kwok DRA driver")
            cluster.stop_component("karpenter")
            karpenter.start(cluster, instance_types(), tools, name=KARPENTER_DRA, ignore_dra_requests=False)
            cluster.install_crds([dra_config_crd(tools)], 60.0)
            cluster.add_components([karpenter.dra_driver(tools, cluster)])
            await create(
                api,
                f"/apis/{karpenter.DRA_CONFIG_GROUP}/v1alpha1/{karpenter.DRA_CONFIGS}",
                dra_driver_config(dra_workload),
            )
            for body in node_pools(KARPENTER_DRA):
                await create(api, f"/apis/{karpenter.GROUP}/{karpenter.VERSION}/{karpenter.NODE_POOLS}", body)
            log_path = cluster.layout.logs / f"{KARPENTER_DRA}.log"
            outcome = await measure(api, KARPENTER_DRA, dra_workload, log_path)
            driver_log = cluster.layout.logs / "karpenter-dra-kwok-driver.log"
            outcome.driver_check = await driver_check(api, dra_workload, driver_log)
            outcomes.append(outcome)
        finally:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
    return outcomes


# -- the section --------------------------------------------------------------------------------

HEADER = (
    "workload",
    "setup",
    "nodes launched",
    "pods Running",
    "pods left Pending",
    "GPUs launched beyond the need",
    "pods created → all Running",
    "what it did",
)


def render(outcomes: Sequence[Outcome], machine: Sequence[tuple[str, str]]) -> str:
    table = Grid(
        title="Autoscalers: gpumon + Cluster API beside Karpenter, same pending pods",
        method=(
            "Each workload's pods are created for both setups at the same moment (a Deployment in a "
            "namespace per setup: the same pod spec and requests, their node selector naming the "
            "setup's pool). Time runs from creating the pods to all of them Running, polled every "
            f"{POLL_SECONDS} s, at most {DEADLINE_SECONDS:.0f} s. 'Need' is the fewest nodes of the "
            "shape that hold every pod, gpushare memory and cGPU core share per card; GPUs beyond the "
            "need are those on nodes past it."
        ),
        header=HEADER,
        rows=tuple(o.row() for o in outcomes),
    )
    notes = []
    for o in outcomes:
        lines = list(o.events) if o.pending else []
        if o.setup != CAPI and o.row()[-1] != "as needed":
            lines += [x for x in o.karpenter_said if x not in lines]
            lines += [f"(log) {x}" for x in o.karpenter_logged]
        if o.driver_check:
            lines.append(f"(kwok DRA driver check) {o.driver_check}")
        if lines:
            notes.append(f"{o.workload.name}, {SETUP_TITLES[o.setup]}: " + "; ".join(f"`{x}`" for x in lines))
    return section_markdown(
        SECTION,
        title="Autoscalers (issue #28)",
        intro=INTRO,
        machine=machine,
        tables=[table],
        notes=[*NOTES, *(f"Events — {n}" for n in notes)],
    )


INTRO = """\
`python -m bench autoscalers`: the same pending GPU pods given to gpumon scaling a Cluster API
MachineDeployment (Cluster API v1.13.6's own controllers, the devcluster's kwok infrastructure
provider) and to Karpenter v1.15.0 scaling a NodePool (its kwok cloud provider), each offered
exactly one node shape per workload, the same for both. Neither side is tuned: gpumon's pools
take every default but `max_replicas: 6`, Karpenter's NodePools every default. The kube-scheduler
of the local control plane places the pods for both; kwok plays every kubelet."""

NOTES = (
    "gpushare and cGPU: Kubernetes counts `aliyun.com/gpu-mem` and `aliyun.com/gpu-core.percentage` "
    "per node; on a real cluster Alibaba's scheduler extender binds each pod to one GPU, which the "
    "local control plane does not run. So the pods a setup launched too little for run here all "
    "the same; 'what it did' counts those that no GPU of the launched nodes holds (the pods past "
    "the launched nodes' per-card room): beside the extender they would stay Pending. Without it "
    "the kube-scheduler also places pods by the node's sums, on whichever setup's nodes.",
    "DRA: the DRA nodes of the first two setups get their ResourceSlice from a stand-in of NVIDIA's "
    "DRA kubelet plugin (gpumon.devcluster.resourceslices, NVIDIA's device names and attributes) "
    "once Ready, whoever launched them; with IGNORE_DRA_REQUESTS=false Karpenter's own kwok DRA "
    "driver runs instead, given the same devices in a DRAConfig, and publishes nothing: v1.15.0 "
    "registers its DRAConfig types without `metav1.AddToGroupVersion` "
    "(`dra-kwok-driver/pkg/apis/v1alpha1/draconfig_types.go:153-157`), so its every list of "
    "DRAConfigs fails (the driver check below). Karpenter v1.15.0 with DRA requests ignored "
    "(its default) refuses every pod with a claim before simulating it "
    "(`pkg/controllers/provisioning/scheduling/scheduler.go`, `add`: 'pod has Dynamic Resource "
    "Allocation requirements that are not yet supported by Karpenter'). With them on, a NodeClaim "
    "not yet launched offers only the devices its instance type declares "
    "(`DynamicResources.ResourceSliceTemplates`, `scheduling/dra.go`), and the kwok provider's "
    "instance types declare none (`kwok/cloudprovider/helpers.go`, `InstanceTypeOptions` and "
    "`newInstanceType`); the driver would publish slices only for nodes that exist.",
    "Events: per row, the latest Event of each source and reason on the pods left Pending, and "
    "everything Karpenter said of its pods; cut at 400 characters.",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench autoscalers", description=__doc__)
    parser.add_argument("--output", type=Path, help=f"where to write (default: {RESULTS}); '-': print")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpumon-bench-autoscalers-") as tmp:
        root = Path(tmp)
        log("starting the local control plane")
        cluster = DevCluster.start(root / "cluster", tools=locate())
        try:
            outcomes = asyncio.run(run_all(cluster, root))
        finally:
            cluster.stop()
    seconds = time.monotonic() - started
    machine = [
        ("CPU", f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, shared"),
        ("load average at the end (1/5/15 min)", load_average()),
        ("the whole bench's wall time (control plane, both setups, every workload)", f"{seconds:.0f} s"),
        ("Kubernetes / Cluster API / Karpenter", "v1.36.3 / v1.13.6 / v1.15.0 (kwok provider)"),
    ]
    section = render(outcomes, machine)
    output = args.output or RESULTS
    if str(output) == "-":
        sys.stdout.write(section + "\n")
    else:
        output.write_text(splice(output.read_text() if output.exists() else "", section))
        print(f"bench: wrote {output} in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``gpumon status allocation`` against the real control plane: gpushare, cGPU, HAMi, MIG and
whole-GPU nodes side by side, pods placed on nodes by the real kube-scheduler; the card of a
shared pod chosen the way the devcluster's scheduler-extender stand-in chooses it (gpushare
binpack, ``gpumon.demo.agents.assign_shared``; HAMi: first card with room, written the way HAMi's
scheduler writes it), whole GPUs the way its device-manager stand-in hands them out
(``assign_gpus``, served to a real exporter app). Status, run as a separate process, must show
every pod on the node the scheduler bound it to and on the card the annotations or the exporter
name, with the sums per card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from controller_harness import TEST_LABEL, exporters
from kubernetes_asyncio import client
from test_status import flat, gpumon

from gpumon.demo.agents import assign_gpus, assign_shared
from gpumon.demo.views import pod_view
from gpumon.devcluster import nodes
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker, node_ready
from gpumon.devcluster.waiting import eventually
from gpumon.k8s import sharing
from gpumon.kube.client import KubeClient
from gpumon.status.allocation import HAMI_REGISTER

SCHEME = "test.gpumon.io/scheme"
MERGE_PATCH = "application/merge-patch+json"
HAMI_UUIDS = ["GPU-5a11ed00-0000-4000-8000-000000000000", "GPU-5a11ed01-0000-4000-8000-000000000000"]


def node_body(
    name: str, test_id: str, scheme: str, template: nodes.NodeTemplate, **extra: Any
) -> dict[str, Any]:
    body = nodes.manifest(name, template, extra_labels={TEST_LABEL: test_id, SCHEME: scheme})
    capacity = extra.pop("capacity", None)
    if capacity is not None:
        base = {k: v for k, v in body["status"]["capacity"].items() if k in ("cpu", "memory", "pods")}
        body["status"]["capacity"] = body["status"]["allocatable"] = base | capacity
    body["metadata"]["annotations"].update(extra.pop("annotations", {}))
    return body


def pod_body(name: str, test_id: str, limits: dict[str, str], scheme: str | None = None) -> dict[str, Any]:
    selector = {TEST_LABEL: test_id} | ({SCHEME: scheme} if scheme else {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "app", "resources": {"limits": limits}}],
        },
    }


async def test_allocation_matches_what_was_placed(
    api: client.ApiClient,
    kube: KubeClient,
    devcluster: DevCluster,
    namespace: str,
    test_id: str,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    maker = NodeMaker(kube, test_id)  # deletes what it made; the bodies are our own
    share, cgpu, hami, mig, whole = (f"{test_id}-{s}" for s in ("share", "cgpu", "hami", "mig", "whole"))
    register = "".join(
        f"{u},10,16384,100,NVIDIA-A100,0,true,{i},hami-core:" for i, u in enumerate(HAMI_UUIDS)
    )
    bodies = [
        node_body(share, test_id, "gpushare", nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(2, 16))),
        node_body(cgpu, test_id, "gpushare", nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(1, 24))),
        node_body(
            hami,
            test_id,
            "hami",
            nodes.NodeTemplate(gpus=2),
            capacity={nodes.GPU: "20"},
            annotations={HAMI_REGISTER: register},
        ),
        node_body(mig, test_id, "mig", nodes.NodeTemplate(gpus=1), capacity={"nvidia.com/mig-1g.10gb": "7"}),
        node_body(whole, test_id, "whole", nodes.NodeTemplate(gpus=4)),
    ]
    try:
        for body in bodies:
            await core.create_node(body)
            maker.created.append(body["metadata"]["name"])
        for name in maker.created:
            await eventually(lambda name=name: node_ready(kube, name), what=f"node {name} Ready")

        mem, core_pct = sharing.GPUSHARE_MEMORY_RESOURCE, sharing.CGPU_CORE_RESOURCE
        specs = {
            "gs-4": ({mem: "4"}, None),
            "gs-6": ({mem: "6"}, None),
            "gs-8": ({mem: "8"}, None),
            "gs-10": ({mem: "10"}, None),
            "cg-4-30": ({mem: "4", core_pct: "30"}, None),
            "cg-2-50": ({mem: "2", core_pct: "50"}, None),
            "too-big": ({mem: "40"}, None),  # fits no card: stays Pending
            "hami-a": ({nodes.GPU: "1"}, "hami"),
            "hami-b": ({nodes.GPU: "1"}, "hami"),
            "mig-1": ({"nvidia.com/mig-1g.10gb": "1"}, "mig"),
            "mig-2": ({"nvidia.com/mig-1g.10gb": "2"}, "mig"),
            "whole-1": ({nodes.GPU: "1"}, "whole"),
            "whole-2": ({nodes.GPU: "2"}, "whole"),
        }
        for name, (limits, scheme) in specs.items():
            await core.create_namespaced_pod(namespace, pod_body(name, test_id, limits, scheme))

        async def bound() -> dict[str, dict[str, Any]] | None:
            pods = (await core.list_namespaced_pod(namespace)).items
            out = {p.metadata.name: api.sanitize_for_serialization(p) for p in pods}
            placed = {n for n, p in out.items() if (p.get("spec") or {}).get("nodeName")}
            return out if placed == set(specs) - {"too-big"} else None

        pods = await eventually(bound, what="the scheduler binds every pod that fits")
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in pods.values():
            if p["spec"].get("nodeName"):
                by_node.setdefault(p["spec"]["nodeName"], []).append(p)

        # The gpushare extender's stand-in picks the card on the node the scheduler chose.
        for name, count, gib in ((share, 2, 16), (cgpu, 1, 24)):
            rows = [pod_view(p) for p in by_node.get(name, [])]
            for key, index in assign_shared(rows, count, gib).items():
                annotations = {
                    sharing.GPUSHARE_INDEX: str(index),
                    sharing.GPUSHARE_POD_MEMORY: str(next(r.gpu_memory for r in rows if r.key == key)),
                    sharing.GPUSHARE_ASSIGNED: "true",
                }
                await core.patch_namespaced_pod(
                    key.split("/")[1],
                    namespace,
                    {"metadata": {"annotations": annotations}},
                    _content_type=MERGE_PATCH,
                )
        # HAMi's scheduler writes the card's UUID, memory MiB and cores per container.
        for i, p in enumerate(sorted(by_node[hami], key=lambda p: p["metadata"]["name"])):
            value = f"{HAMI_UUIDS[i % 2]},NVIDIA,4096,25:;"
            await core.patch_namespaced_pod(
                p["metadata"]["name"],
                namespace,
                {"metadata": {"annotations": {sharing.HAMI_ALLOCATED: value}}},
                _content_type=MERGE_PATCH,
            )
        pods = await bound()
        assert pods is not None

        # The whole-GPU node's exporter: the kubelet's device manager stand-in hands out GPUs.
        async with exporters([whole], gpus=4) as ex:
            rows = [pod_view(p) for p in by_node[whole]]
            held = assign_gpus(rows, {}, 4)
            ex[whole].placement.pods = {
                i: (namespace, key.split("/")[1]) for key, ids in held.items() for i in ids
            }
            config = tmp_path / "controller.yaml"
            config.write_text(yaml.safe_dump({"signals": {"direct": {"endpoints": {whole: ex[whole].url}}}}))
            common = ["--kubeconfig", str(devcluster.kubeconfig), "--config", str(config),
                      "--selector", f"{TEST_LABEL}={test_id}"]  # fmt: skip

            async def shown() -> dict[str, Any] | None:
                code, out, err = await gpumon("status", "allocation", "-o", "json", *common)
                assert code == 0, err
                doc = json.loads(out)
                cards = {c["index"]: c for n in doc["nodes"] if n["name"] == whole for c in n["cards"]}
                return doc if sum(len(c["holders"]) for c in cards.values()) == 3 else None

            doc = await eventually(shown, what="status shows the whole-GPU pods on their cards")

        view = {n["name"]: n for n in doc["nodes"]}
        assert set(view) == {share, cgpu, hami, mig, whole}
        seen: dict[str, tuple[str, int | None, str | None]] = {}  # pod -> (node, card, uuid)
        for n in doc["nodes"]:
            for c in n["cards"]:
                for h in c["holders"]:
                    seen.setdefault(h["pod"].split("/")[1], (n["name"], c["index"], c["uuid"]))
            for h in n["unplaced"]:
                seen[h["pod"].split("/")[1]] = (n["name"], None, None)

        for name, p in pods.items():
            node_name = p["spec"].get("nodeName")
            annotations = p["metadata"].get("annotations") or {}
            if node_name is None:
                assert name not in seen  # Pending: holds nothing
            elif sharing.GPUSHARE_INDEX in annotations:
                assert seen[name][:2] == (node_name, int(annotations[sharing.GPUSHARE_INDEX])), name
            elif sharing.HAMI_ALLOCATED in annotations:
                assert (seen[name][0], seen[name][2]) == (
                    node_name,
                    annotations[sharing.HAMI_ALLOCATED].split(",")[0],
                )
            elif node_name == whole:
                assert seen[name][:2] in {(whole, i) for i in held[f"{namespace}/{name}"]}, name
            else:  # MIG: the kubelet picks the device; without an exporter counted per node
                assert seen[name] == (node_name, None, None), name

        # Sums per card, against the pods' own limits.
        for name in (share, cgpu):
            for c in view[name]["cards"]:
                on_card = [pods[h["pod"].split("/")[1]] for h in c["holders"]]
                limits = [p["spec"]["containers"][0]["resources"]["limits"] for p in on_card]
                assert c["memory_allocated_gib"] == sum(int(lim[mem]) for lim in limits)
                assert c["core_allocated_percent"] == sum(int(lim.get(core_pct, 0)) for lim in limits)
                assert c["memory_total_gib"] == (16 if name == share else 24)
        assert [
            (c["uuid"], c["memory_allocated_gib"], c["core_allocated_percent"]) for c in view[hami]["cards"]
        ] == [
            (HAMI_UUIDS[0], 4, 25),
            (HAMI_UUIDS[1], 4, 25),
        ]
        assert view[mig]["devices"] == {"nvidia.com/mig-1g.10gb": [3, 7]}
        assert view[whole]["devices"] == {nodes.GPU: [3, 4]}
        # Usage: the whole-GPU node's exporter answered; the others have none and say so.
        assert view[whole]["usage_error"] is None and view[whole]["cards"][0]["memory_total_gib"] is not None
        assert view[share]["usage_error"] == "no running exporter pod on the node"

        # The table, and one node.
        code, out, err = await gpumon("status", "allocation", *common)
        assert code == 0, err
        text = flat(out)
        assert share in text and "card not known" in text and "gpushare" in text
        code, out, err = await gpumon(
            "status", "allocation", "--node", mig, "-o", "json", "--no-usage", *common
        )
        assert code == 0, err
        assert [n["name"] for n in json.loads(out)["nodes"]] == [mig]
        code, _, err = await gpumon("status", "allocation", "--node", "no-such-node", *common)
        assert code == 1 and "no node named" in err
    finally:
        await maker.delete_all()

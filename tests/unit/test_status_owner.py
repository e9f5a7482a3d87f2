"""`gpumon status` names the machinery that owns each node - Cluster API, Karpenter, or none -
from the Node as Cluster API v1.13 and Karpenter v1.15 write it (core/node_owner.py)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from status_builders import node, record, state

from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core import contract as c
from gpumon.status import render
from gpumon.status.explain import build_explanation
from gpumon.status.fleet import build_fleet


def by_cluster_api(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["annotations"] |= {
        c.MACHINE_ANNOTATION: "md-0-x7k",
        c.MACHINE_NAMESPACE_ANNOTATION: "fleet",
    }
    return obj


def by_karpenter(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["labels"][c.KARPENTER_NODEPOOL_LABEL] = "gpu"
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "gpu-h2m9q", "uid": "u"}
    ]
    return obj


def quarantined(name: str) -> dict[str, Any]:
    return node(name, records=(record(1),), quarantined_ago=60, state="drained")


def text(renderable: Any) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_fleet_names_each_nodes_machinery_per_pool_and_per_quarantined_node() -> None:
    nodes = [by_cluster_api(quarantined("capi-1")), by_karpenter(quarantined("kpt-1")), node("plain-1")]
    fleet = build_fleet(state(nodes), pool_label="gpumon.io/pool")
    (pool,) = fleet.pools
    assert pool.machinery == {"cluster-api": 1, "karpenter": 1, "none": 1}
    owned = {n.name: (n.machinery, n.owner) for n in fleet.quarantined}
    assert owned == {
        "capi-1": ("cluster-api", "Machine fleet/md-0-x7k"),
        "kpt-1": ("karpenter", "NodeClaim gpu-h2m9q"),
    }
    shown = text(render.fleet(fleet))
    assert "Cluster API 1, Karpenter 1, none 1" in shown
    assert "Cluster API (Machine fleet/md-0-x7k)" in shown and "Karpenter (NodeClaim gpu-h2m9q)" in shown
    assert render.to_jsonable(fleet)["pools"][0]["machinery"] == {"cluster-api": 1, "karpenter": 1, "none": 1}


def test_one_node_says_what_owns_it_or_that_nothing_does() -> None:
    for obj, said in [
        (by_karpenter(quarantined("kpt-1")), "owned by Karpenter (NodeClaim gpu-h2m9q)"),
        (node("plain-1"), "owned by none"),
    ]:
        why = build_explanation(
            state([obj]), pool_label="gpumon.io/pool", policy=build_policy(ControllerConfig())
        )
        assert said in text(render.explanation(why))

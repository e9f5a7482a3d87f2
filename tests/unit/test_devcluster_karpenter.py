"""What the devcluster gives Karpenter's kwok provider: instance types and NodePools."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from gpumon.devcluster import karpenter, nodes
from gpumon.devcluster.binaries import Karpenter


def test_instance_types_offer_a_templates_gpus_on_demand() -> None:
    shared = nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(4, 16))
    types = json.loads(
        karpenter.instance_types_file(
            [
                karpenter.InstanceType("gpu-8x", nodes.NodeTemplate(gpus=8)),
                karpenter.InstanceType("share-4x", shared),
            ]
        )
    )
    assert [t["name"] for t in types] == ["gpu-8x", "share-4x"]
    assert types[0]["resources"]["nvidia.com/gpu"] == "8" and types[0]["resources"]["cpu"] == "96"
    assert types[1]["resources"]["aliyun.com/gpu-mem"] == "64"
    (offering,) = types[0]["offerings"]
    assert offering["Available"] is True
    assert {r["key"] for r in offering["Requirements"]} == {
        "karpenter.sh/capacity-type",
        "topology.kubernetes.io/zone",
    }


def test_a_node_pool_launches_only_its_instance_types_with_its_labels_and_taints() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    pool = karpenter.node_pool("gpu", ["gpu-8x"], labels={"a": "b"}, taints=[taint])
    template = pool["spec"]["template"]
    assert template["metadata"]["labels"] == {"a": "b"}
    assert template["spec"]["taints"] == [taint]
    assert template["spec"]["nodeClassRef"]["name"] == karpenter.node_class()["metadata"]["name"]
    (req,) = template["spec"]["requirements"]
    assert req == {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-8x"]}


def test_the_node_repair_gate_is_on_only_when_asked(tmp_path: Path) -> None:
    tools = Karpenter(controller=tmp_path / "karpenter", dra_driver=tmp_path / "dra", crds=())
    cluster = SimpleNamespace(kubeconfig=tmp_path / "kubeconfig")
    plain = karpenter.controller(tools, cluster, "types.json", (1, 2))  # type: ignore[arg-type]
    assert not [a for a in plain.argv if a.startswith("--feature-gates")]
    assert "FEATURE_GATES" not in plain.env
    gated = karpenter.controller(tools, cluster, "types.json", (1, 2), node_repair=True)  # type: ignore[arg-type]
    assert [a for a in gated.argv if a.startswith("--feature-gates")] == ["--feature-gates=NodeRepair=true"]

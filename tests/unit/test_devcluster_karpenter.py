"""What the devcluster gives Karpenter's kwok provider: instance types and NodePools."""

from __future__ import annotations

import json

from gpumon.devcluster import karpenter, nodes


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

"""Which machinery owns a Node: the shapes Cluster API and Karpenter write (as seen on the real
control plane)."""

from __future__ import annotations

from gpumon.controller.core.node_owner import NodeOwner, node_owner

CAPI_NODE = {
    "metadata": {
        "name": "gpu-k96m2-96tsz",
        "annotations": {
            "cluster.x-k8s.io/cluster-name": "devcluster",
            "cluster.x-k8s.io/cluster-namespace": "t1",
            "cluster.x-k8s.io/machine": "gpu-k96m2-96tsz",
            "cluster.x-k8s.io/owner-kind": "MachineSet",
            "cluster.x-k8s.io/owner-name": "gpu-k96m2",
            "kwok.x-k8s.io/node": "fake",
        },
    }
}
KARPENTER_NODE = {
    "metadata": {
        "name": "kwok-gpu-4vxrc-stingergrass-1-6noueocllq-1214230568",
        "labels": {"karpenter.sh/nodepool": "gpu", "karpenter.sh/registered": "true"},
        "ownerReferences": [
            {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "gpu-4vxrc", "uid": "u"}
        ],
    }
}


def test_a_cluster_api_node_is_owned_by_its_machine() -> None:
    owner = node_owner(CAPI_NODE)
    assert owner == NodeOwner("cluster-api", "Machine", "cluster.x-k8s.io/v1beta2", "gpu-k96m2-96tsz", "t1")
    assert owner.path == "/apis/cluster.x-k8s.io/v1beta2/namespaces/t1/machines/gpu-k96m2-96tsz"


def test_a_karpenter_node_is_owned_by_its_node_claim() -> None:
    owner = node_owner(KARPENTER_NODE)
    assert owner == NodeOwner("karpenter", "NodeClaim", "karpenter.sh/v1", "gpu-4vxrc")
    assert owner.path == "/apis/karpenter.sh/v1/nodeclaims/gpu-4vxrc"


def test_other_nodes_have_no_owner() -> None:
    assert node_owner({"metadata": {"name": "plain", "labels": {"karpenter.sh/nodepool": "gpu"}}}) is None
    # A Machine named without its namespace cannot be found: no owner rather than a guess.
    assert node_owner({"metadata": {"annotations": {"cluster.x-k8s.io/machine": "m"}}}) is None
    other = {
        "metadata": {"ownerReferences": [{"apiVersion": "example.com/v1", "kind": "NodeClaim", "name": "x"}]}
    }
    assert node_owner(other) is None

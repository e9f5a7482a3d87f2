"""The autoscaler bench's arithmetic (bench/autoscalers.py): how many nodes a workload needs,
the GPUs launched past that, and the pods the launched nodes cannot hold one card each."""

from __future__ import annotations

import pytest

from bench.autoscalers import (
    SHARED_T4,
    WORKLOADS,
    Workload,
    gpus_beyond_need,
    nodes_needed,
    pods_per_node,
    unheld,
    verdict,
    without_other_pools,
)
from gpumon.devcluster import nodes

GIB = nodes.SHARED_GPU_MEMORY
CORE = nodes.SHARED_GPU_CORE


def test_each_workload_needs_the_nodes_its_shape_holds() -> None:
    """Whole GPUs: 3 of 8 per pod, two pods a node. gpushare: 10 GiB on 16 GiB cards is one pod
    a card (the node's 64 GiB would say six). cGPU: 50 % core is two pods a card, before its
    4 GiB. MIG: four 3g.40gb a node. DRA: eight devices a node."""
    per_node = {w.name: pods_per_node(w.template, w.ask()) for w in WORKLOADS}
    assert per_node == {"whole": 2, "gpushare": 4, "cgpu": 8, "mig": 4, "dra": 8}
    assert {w.name: nodes_needed(w) for w in WORKLOADS} == {
        "whole": 2,
        "gpushare": 2,
        "cgpu": 2,
        "mig": 2,
        "dra": 2,
    }


def test_a_pod_no_node_can_hold_is_an_error_not_zero_nodes() -> None:
    too_big = Workload("big", "big", SHARED_T4, "share-4x-t4", 1, {GIB: "17"})
    assert pods_per_node(SHARED_T4, too_big.ask()) == 0
    with pytest.raises(ValueError, match="cannot hold"):
        nodes_needed(too_big)


def test_gpus_beyond_the_need_count_whole_nodes_past_the_fewest() -> None:
    assert gpus_beyond_need(3, 2, 8) == 8
    assert gpus_beyond_need(2, 2, 8) == 0
    assert gpus_beyond_need(0, 2, 8) == 0  # too few is pods left Pending, not negative GPUs
    assert gpus_beyond_need(5, 2, 4) == 12


def test_pods_the_launched_nodes_cannot_hold_count_per_card_room() -> None:
    """Six 10 GiB pods: one 4 x 16 GiB node holds four (one a card), although its 64 GiB sum
    would take all six; two nodes hold them all."""
    per_node = pods_per_node(SHARED_T4, {GIB: 10})
    assert unheld(6, 1, per_node) == 2
    assert unheld(6, 2, per_node) == 0
    assert unheld(6, 0, per_node) == 6


def test_the_verdict_names_nothing_too_much_too_little_and_what_no_card_holds() -> None:
    def said(launched: int, running: int, pods: int = 6, per_card: bool = True) -> str:
        return verdict(launched=launched, needed=2, per_node=4, running=running, pods=pods, per_card=per_card)

    assert said(0, 0) == "nothing: no node launched"
    assert said(2, 6) == "as needed"
    assert said(3, 6) == "too much: 1 node(s) more than needed"
    assert said(1, 6) == (
        "too little: 1 node(s) short; 2 pod(s) Running only because Kubernetes sums the node's "
        "cards: no GPU of the launched nodes holds them"
    )
    assert said(1, 4, per_card=False) == "too little: 1 node(s) short; 2 pod(s) left Pending"
    assert said(1, 8, pods=10, per_card=False) == "too little: 1 node(s) short; 2 pod(s) left Pending"


def test_karpenter_reasons_keep_the_clauses_on_the_pods_own_node_pool() -> None:
    """Karpenter writes one clause per NodePool; those naming another setup's pool label go."""
    other = (
        "incompatible requirements, key bench.gpumon.io/pool, bench.gpumon.io/pool In [karpenter-dra-dra] "
        "not in bench.gpumon.io/pool In [karpenter-whole]"
    )
    own = "allocating dynamic resources, no instance type can satisfy the allocation"
    message = f"Failed to schedule pod, {other}; {own}; {other}"
    assert without_other_pools(message) == (
        "Failed to schedule pod, allocating dynamic resources, no instance type can satisfy the "
        "allocation; [2 on the other setups' NodePools left out]"
    )
    plain = "Failed to schedule pod, pod has Dynamic Resource Allocation requirements"
    assert without_other_pools(plain) == plain

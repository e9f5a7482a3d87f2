"""The autoscaler bench's arithmetic (bench/autoscalers.py): how many nodes a workload needs,
the GPUs launched past that, and which pods a shared GPU could not hold on one card."""

from __future__ import annotations

import pytest

from bench.autoscalers import (
    SHARED_T4,
    WORKLOADS,
    Workload,
    gpus_beyond_need,
    nodes_needed,
    off_card,
    pods_per_node,
    verdict,
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


def test_pods_one_card_cannot_hold_are_counted_by_first_fit() -> None:
    """Six 10 GiB pods on one node of four 16 GiB cards: four fit, one a card; two are over
    although the node's 64 GiB sum holds all six. Eight 50 % pods fit two a card exactly."""
    assert off_card([{GIB: 10}] * 6, SHARED_T4) == 2
    assert off_card([{GIB: 10}] * 4, SHARED_T4) == 0
    assert off_card([{CORE: 50, GIB: 4}] * 8, SHARED_T4) == 0
    assert off_card([{CORE: 50, GIB: 4}] * 9, SHARED_T4) == 1
    # Largest first: 12 + 4 fill a card where arrival order would strand the 12.
    assert off_card([{GIB: 4}] * 4 + [{GIB: 12}] * 4, SHARED_T4) == 0
    assert off_card([{nodes.GPU: 3}] * 9, nodes.NodeTemplate(gpus=8)) == 0  # no cards to fit


def test_the_verdict_names_nothing_too_much_too_little_and_off_card() -> None:
    assert verdict(launched=0, needed=2, running=0, pods=10) == "nothing: no node launched"
    assert verdict(launched=2, needed=2, running=10, pods=10) == "as needed"
    assert verdict(launched=3, needed=2, running=10, pods=10) == "too much: 1 node(s) more than needed"
    assert (
        verdict(launched=1, needed=2, running=6, pods=6, off_card_pods=2)
        == "too little: 1 node(s) short; 2 pod(s) Running where no single GPU holds them"
    )
    assert verdict(launched=1, needed=2, running=8, pods=10) == (
        "too little: 1 node(s) short; 2 pod(s) left Pending"
    )

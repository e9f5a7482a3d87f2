"""Shared-GPU allocations from gpushare/cGPU and HAMi annotations and limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from gpumon.k8s.resources import CGPU_CORE_RESOURCE, GPUSHARE_MEMORY_RESOURCE
from gpumon.k8s.sharing import (
    GPUSHARE_ASSIGNED,
    GPUSHARE_INDEX,
    GPUSHARE_POD_MEMORY,
    HAMI_ALLOCATED,
    CardRef,
    SharedAllocation,
    pod_cards,
    shared_allocations,
)

MEM = GPUSHARE_MEMORY_RESOURCE
GIB = 1 << 30
MIB = 1 << 20
UUID_A = "GPU-7c1f2a9e-0d3b-4c5a-8e6f-1a2b3c4d5e6f"
UUID_B = "GPU-1d2e3f40-5a6b-4c7d-8e9f-a0b1c2d3e4f5"


@dataclass(frozen=True)
class C:
    name: str
    limits: Mapping[str, str] = field(default_factory=dict)


def gpushare(
    annotations: Mapping[str, str], *containers: C, init: tuple[C, ...] = (), unit: int = GIB
) -> tuple[list[SharedAllocation], list[str]]:
    r = shared_allocations(annotations, init, containers, gpushare_unit_bytes=unit)
    return list(r.allocations), list(r.problems)


ASSIGNED = {GPUSHARE_INDEX: "1", GPUSHARE_POD_MEMORY: "5", GPUSHARE_ASSIGNED: "true"}


def test_gpushare_each_container_gets_its_limit_on_the_indexed_gpu() -> None:
    allocations, problems = gpushare(
        ASSIGNED,
        C("train", {GPUSHARE_MEMORY_RESOURCE: "3"}),
        C("sidecar"),
        C("infer", {GPUSHARE_MEMORY_RESOURCE: "2", CGPU_CORE_RESOURCE: "30"}),
    )
    assert problems == []
    assert allocations == [
        SharedAllocation("train", None, 1, 3 * GIB, None),
        SharedAllocation("infer", None, 1, 2 * GIB, 0.30),
    ]


def test_gpushare_memory_unit_mib() -> None:
    allocations, _ = gpushare(
        {GPUSHARE_INDEX: "0", GPUSHARE_POD_MEMORY: "2048"},
        C("c", {GPUSHARE_MEMORY_RESOURCE: "2048"}),
        unit=MIB,
    )
    assert allocations == [SharedAllocation("c", None, 0, 2 * GIB, None)]


@pytest.mark.parametrize(
    "annotations",
    [
        {},  # not placed by the extender
        {GPUSHARE_INDEX: "0", GPUSHARE_ASSIGNED: "false"},  # placed, not yet allocated by the kubelet
        {GPUSHARE_INDEX: "0", GPUSHARE_ASSIGNED: "False"},
    ],
)
def test_gpushare_not_yet_allocated(annotations: Mapping[str, str]) -> None:
    assert gpushare(annotations, C("c", {GPUSHARE_MEMORY_RESOURCE: "4"})) == ([], [])


def test_gpushare_without_assigned_flag_counts_as_allocated() -> None:
    allocations, _ = gpushare({GPUSHARE_INDEX: "0"}, C("c", {GPUSHARE_MEMORY_RESOURCE: "4"}))
    assert allocations == [SharedAllocation("c", None, 0, 4 * GIB, None)]


def test_gpushare_init_containers_are_included() -> None:
    allocations, _ = gpushare(
        {GPUSHARE_INDEX: "2"},
        C("main", {GPUSHARE_MEMORY_RESOURCE: "1"}),
        init=(C("warm", {GPUSHARE_MEMORY_RESOURCE: "1"}),),
    )
    assert [a.container for a in allocations] == ["warm", "main"]


@pytest.mark.parametrize(
    ("annotations", "limits", "problem"),
    [
        ({GPUSHARE_INDEX: "one"}, {GPUSHARE_MEMORY_RESOURCE: "1"}, "gpushare_invalid_index"),
        ({GPUSHARE_INDEX: "-1"}, {GPUSHARE_MEMORY_RESOURCE: "1"}, "gpushare_invalid_index"),
        ({GPUSHARE_INDEX: "0"}, {GPUSHARE_MEMORY_RESOURCE: "1.5"}, "invalid_quantity"),
        (
            {GPUSHARE_INDEX: "0"},
            {GPUSHARE_MEMORY_RESOURCE: "1", CGPU_CORE_RESOURCE: "150"},
            "cgpu_invalid_core",
        ),
        (
            {GPUSHARE_INDEX: "0", GPUSHARE_POD_MEMORY: "8"},
            {GPUSHARE_MEMORY_RESOURCE: "4"},
            "gpushare_pod_memory_mismatch",
        ),
    ],
)
def test_gpushare_problems(annotations: Mapping[str, str], limits: Mapping[str, str], problem: str) -> None:
    _, problems = gpushare(annotations, C("c", limits))
    assert problem in problems


def test_cgpu_core_share_keeps_memory() -> None:
    allocations, problems = gpushare(
        {GPUSHARE_INDEX: "0"}, C("c", {GPUSHARE_MEMORY_RESOURCE: "4", CGPU_CORE_RESOURCE: "150"})
    )
    assert allocations == [SharedAllocation("c", None, 0, 4 * GIB, None)]
    assert problems == ["cgpu_invalid_core"]


def hami(value: str, *containers: C, init: tuple[C, ...] = ()) -> tuple[list[SharedAllocation], list[str]]:
    r = shared_allocations({HAMI_ALLOCATED: value}, init, containers, gpushare_unit_bytes=GIB)
    return list(r.allocations), list(r.problems)


def test_hami_one_container_one_device() -> None:
    assert hami(f"{UUID_A},NVIDIA,3000,30:;", C("app")) == (
        [SharedAllocation("app", UUID_A, None, 3000 * MIB, 0.30)],
        [],
    )


def test_hami_containers_and_devices_align_with_the_spec() -> None:
    value = f"{UUID_A},NVIDIA,1000,25:{UUID_B},NVIDIA,2000,50:;;{UUID_B},NVIDIA,500,0:;"
    allocations, problems = hami(value, C("a"), C("no-gpu"), C("c"))
    assert problems == []
    assert allocations == [
        SharedAllocation("a", UUID_A, None, 1000 * MIB, 0.25),
        SharedAllocation("a", UUID_B, None, 2000 * MIB, 0.50),
        SharedAllocation("c", UUID_B, None, 500 * MIB, None),  # 0 cores: no core limit
    ]


def test_hami_entries_include_init_containers_in_newer_releases() -> None:
    value = f";{UUID_A},NVIDIA,1000,10:;"
    allocations, _ = hami(value, C("main"), init=(C("setup"),))
    assert allocations == [SharedAllocation("main", UUID_A, None, 1000 * MIB, 0.10)]


def test_hami_entries_of_older_releases_list_only_containers() -> None:
    allocations, _ = hami(f"{UUID_A},NVIDIA,1000,10:", C("main"), init=(C("setup"),))
    assert allocations == [SharedAllocation("main", UUID_A, None, 1000 * MIB, 0.10)]


def test_hami_old_join_format_with_empty_last_container() -> None:
    # Older releases joined entries with ";": two containers, the second without devices.
    allocations, problems = hami(f"{UUID_A},NVIDIA,1000,10:;", C("a"), C("b"))
    assert problems == []
    assert allocations == [SharedAllocation("a", UUID_A, None, 1000 * MIB, 0.10)]


def test_hami_legacy_mig_uuid_names_the_parent() -> None:
    allocations, _ = hami(f"{UUID_A}[1-0],NVIDIA,5000,0:;", C("a"))
    assert allocations[0].gpu_uuid == UUID_A


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (f"{UUID_A},NVIDIA,1000,10:;x:;y:;", "hami_container_mismatch"),
        (f"{UUID_A},NVIDIA,lots,10:;", "hami_invalid"),
        (f"{UUID_A},NVIDIA,1000:;", "hami_invalid"),
        (f"{UUID_A},NVIDIA,1000,101:;", "hami_invalid"),
        (",NVIDIA,1000,10:;", "hami_invalid"),
    ],
)
def test_hami_problems(value: str, problem: str) -> None:
    assert hami(value, C("a")) == ([], [problem])


def test_empty_hami_annotation_is_no_allocation() -> None:
    assert hami("", C("a")) == ([], [])


@pytest.mark.parametrize(
    ("limit", "gib"),
    [("16", 16), ("+4", 4), ("4000m", 4), ("1e1", 10), ("1k", 1000), (" 7 ", 7)],
)
def test_a_gpushare_limit_is_read_in_the_one_quantity_grammar(limit: str, gib: int) -> None:
    allocations, problems = gpushare({GPUSHARE_INDEX: "0"}, C("main", {MEM: limit}))
    assert problems == [] and [a.memory_bytes for a in allocations] == [gib * GIB]


@pytest.mark.parametrize("limit", ["1.5", "500m", "-1", "1e-3", "Gi", "16 Gi", "x"])
def test_a_gpushare_limit_that_is_no_whole_number_of_units_is_a_problem(limit: str) -> None:
    assert gpushare({GPUSHARE_INDEX: "0"}, C("main", {MEM: limit})) == ([], ["invalid_quantity"])


def _pod(annotations: Mapping[str, str], *containers: tuple[str, Mapping[str, str]]) -> dict:
    return {
        "metadata": {"annotations": dict(annotations)},
        "spec": {"containers": [{"name": n, "resources": {"limits": dict(lim)}} for n, lim in containers]},
    }


def test_pod_cards_gpushare_names_the_index() -> None:
    obj = _pod({GPUSHARE_INDEX: "1", GPUSHARE_ASSIGNED: "true"}, ("a", {MEM: "4"}), ("b", {MEM: "2"}))
    assert pod_cards(obj) == (CardRef(None, 1),)
    assert pod_cards(obj)[0].names("GPU-x", 1) and not pod_cards(obj)[0].names("GPU-x", 0)


def test_pod_cards_cgpu_core_only_pod_is_placed_too() -> None:
    obj = _pod({GPUSHARE_INDEX: "0"}, ("a", {CGPU_CORE_RESOURCE: "25"}))
    assert pod_cards(obj) == (CardRef(None, 0),)


def test_pod_cards_hami_names_uuids_not_indexes() -> None:
    value = "GPU-aaa,NVIDIA,1024,30:GPU-bbb,NVIDIA,1024,30:;"
    (a, b) = pod_cards(_pod({HAMI_ALLOCATED: value}, ("main", {})))
    assert (a, b) == (CardRef("GPU-aaa", None), CardRef("GPU-bbb", None))
    assert a.names("GPU-aaa", 7) and not a.names("GPU-bbb", 0)


@pytest.mark.parametrize(
    "obj",
    [
        _pod({}, ("a", {MEM: "4"})),  # a shared pod the extender has not placed yet
        _pod({GPUSHARE_INDEX: "0", GPUSHARE_ASSIGNED: "false"}, ("a", {MEM: "4"})),
        _pod({GPUSHARE_INDEX: "x"}, ("a", {MEM: "4"})),
        {"metadata": {"annotations": {GPUSHARE_INDEX: "0"}}, "spec": {"containers": [{"resources": {}}]}},
        {},
    ],
)
def test_pod_cards_none_when_the_annotations_place_nothing(obj: dict) -> None:
    assert pod_cards(obj) == ()

"""The demo's stand-ins for the kubelet's device manager and gpushare's scheduler extender:
which GPU each pod gets, as the exporters then read it."""

from __future__ import annotations

from demo_builders import pod

from gpumon.demo.agents import assign_gpus, assign_shared, listing
from gpumon.demo.views import PodRow, pod_view


def _pods(*objs: dict[str, object]) -> list[PodRow]:
    return [pod_view(o) for o in objs]


def test_new_pods_get_the_lowest_free_gpus_and_keep_them_for_life() -> None:
    first = _pods(
        pod("a", "n", gpus=2, created="2026-01-01T00:00:01Z"),
        pod("b", "n", gpus=1, created="2026-01-01T00:00:02Z"),
    )
    held = assign_gpus(first, {}, 4)
    assert held == {"gpumon-demo/a": (0, 1), "gpumon-demo/b": (2,)}
    # a leaves; c arrives and takes the lowest free GPUs; b keeps its own.
    later = _pods(
        pod("b", "n", gpus=1, created="2026-01-01T00:00:02Z"),
        pod("c", "n", gpus=2, created="2026-01-01T00:00:03Z"),
    )
    assert assign_gpus(later, held, 4) == {"gpumon-demo/b": (2,), "gpumon-demo/c": (0, 1)}


def test_finished_cpu_only_and_unfitting_pods_hold_nothing() -> None:
    pods = _pods(
        pod("done", "n", phase="Succeeded"),
        pod("cpu", "n", gpus=0),
        pod("big", "n", gpus=3, created="2026-01-01T00:00:01Z"),
        pod("late", "n", gpus=2, created="2026-01-01T00:00:02Z"),
    )
    assert assign_gpus(pods, {"gpumon-demo/done": (0,)}, 4) == {"gpumon-demo/big": (0, 1, 2)}


def test_shared_pods_are_binpacked_onto_the_fullest_gpu_with_room() -> None:
    pods = _pods(
        pod("placed", "s", gpus=0, gpu_mem=8, annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"}),
        pod("x", "s", gpus=0, gpu_mem=4, created="2026-01-01T00:00:01Z"),
        pod("y", "s", gpus=0, gpu_mem=4, created="2026-01-01T00:00:02Z"),
        pod("z", "s", gpus=0, gpu_mem=15, created="2026-01-01T00:00:03Z"),
        pod("too-big", "s", gpus=0, gpu_mem=16, created="2026-01-01T00:00:04Z"),
    )
    # GPU 1 holds 8 GiB: x fills it to 12, y no longer fits (16 > 15) and opens GPU 0; z fits nowhere.
    assert assign_shared(pods, 2, 15) == {"gpumon-demo/x": 1, "gpumon-demo/y": 0}


def test_the_listing_names_each_pods_gpus_by_index() -> None:
    pods = _pods(pod("a", "n", gpus=2), pod("cpu", "n", gpus=0))
    served = listing(pods, {"gpumon-demo/a": (1, 3)})
    assert [(p.namespace, p.name) for p in served] == [("gpumon-demo", "a"), ("gpumon-demo", "cpu")]
    devices = served[0].containers[0].devices
    assert [(d.resource_name, list(d.device_ids)) for d in devices] == [("nvidia.com/gpu", ["1", "3"])]
    assert list(served[1].containers[0].devices) == []

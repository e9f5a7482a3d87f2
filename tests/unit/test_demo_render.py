"""What the demo shows: the live table's content and the log lines of what changed."""

from __future__ import annotations

import io

from demo_builders import node, pod, pool, snapshot, view
from rich.console import Console

from gpumon.demo.render import HeaderStatus, changes, table

EVENT = {
    "metadata": {"name": "e1", "creationTimestamp": "2026-01-01T00:00:05Z"},
    "involvedObject": {"kind": "Node", "name": "gpu-pool-0"},
    "reason": "GpuQuarantined",
    "message": "tainted gpumon.io/gpu-unhealthy",
    "type": "Warning",
    "lastTimestamp": "2026-01-01T00:00:05Z",
}


def test_the_table_shows_nodes_gpus_pods_taints_pool_and_actions() -> None:
    v = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="XidFatal"), node("gpu-pool-1", gpus=0)],
        [pod("trainer-a", "gpu-pool-0"), pod("trainer-b", None, phase="Pending")],
        pool(2, available=1),
        {"gpu-pool-0": snapshot(2, {1: ["trainer-a"]}, states={0: "lost"})},
        [EVENT],
    )
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(
        table(v, HeaderStatus("step 2/5: xid-79", "waiting", 12.0, (("kubeconfig", "/k"),)), ["ready"])
    )
    text = console.export_text()
    for shown in (
        "step 2/5: xid-79",
        "kubeconfig: /k",
        "ready",
        "taint NoSchedule",
        "GpuUnhealthy: XidFatal",
        "0 lost",
        "1 healthy    50% trainer-a",
        "GPUs not offered yet",
        "pool gpu-pool: 2 wanted, 2 machines, 1 with GPUs",
        "1 Running, 1 Pending",
        "GpuQuarantined",
        "tainted gpumon.io/gpu-unhealthy",
    ):
        assert shown in text, shown


def test_the_log_lines_tell_what_changed() -> None:
    before = view(
        [node("gpu-pool-0"), node("gpu-pool-1")],
        [pod("trainer-a", "gpu-pool-0")],
        pool(2),
        {"gpu-pool-0": snapshot(1)},
    )
    after = view(
        [node("gpu-pool-0", taint="NoSchedule", condition="XidFatal"), node("gpu-pool-2")],
        [pod("trainer-a", "gpu-pool-0", deleting=True), pod("trainer-b", "gpu-pool-2")],
        pool(3),
        {"gpu-pool-0": snapshot(1, states={0: "lost"})},
        [EVENT],
    )
    assert changes(before, after) == [
        "node gpu-pool-0: taint NoSchedule, GpuUnhealthy=True (XidFatal), GPU 0 lost",
        "node gpu-pool-2 joined (pool gpu-pool): Ready, no taint, GpuUnhealthy not set, no gpumon state, "
        "schedulable, GPUs allocatable",
        "node gpu-pool-1 left",
        "pool gpu-pool: 3 wanted, 3 machines, 3 with GPUs",
        "pods trainer: 1 Running (gpu-pool-2 1)",
        "controller: GpuQuarantined Node/gpu-pool-0: tainted gpumon.io/gpu-unhealthy",
    ]
    assert changes(after, after) == []

"""The sampler on real simulated GPUs and the real exposition; both clocks are parameters."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from cancellation import assert_ends_cancelled
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpumon.config import SamplingConfig
from gpumon.devices.simulated import SimulatedBackend, parse_fault
from gpumon.exporter.exposition import Profile
from gpumon.exporter.sampler import XID_LOG_BURST, XID_LOG_WINDOW_SECONDS, Sampler, reopen_delay
from gpumon.exporter.self_metrics import SelfMetrics
from gpumon.exporter.watch_events import BackendChange, HealthChange
from gpumon.gpu.health import HealthPolicy
from gpumon.gpu.model import (
    DriverInfo,
    GpuSample,
    HealthState,
    MigInstance,
    MigProfiling,
    PodGpuUsage,
    PodRef,
    Profiling,
    RecoveryAction,
    SlowFields,
    Snapshot,
    XidEvent,
)
from gpumon.wire.v1 import MAX_XIDS_PER_GPU

T0 = 1_800_000_000.0
POLICY = HealthPolicy()


class Clocks:
    """The sampler's wall clock and monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 100.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    ex = ThreadPoolExecutor(max_workers=16)
    yield ex
    ex.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    b = SimulatedBackend(4, seed=3)
    yield b
    b.close()  # releases any read still blocked by a slow fault


def make_sampler(
    backend: SimulatedBackend,
    executor: ThreadPoolExecutor,
    clocks: Clocks,
    *,
    call_timeout: float = 10.0,
    attributor: object = None,
    profile: Profile = "native",
) -> Sampler:
    return Sampler(
        backend,
        node="node-1",
        profile=profile,
        sampling=SamplingConfig(
            fast_interval_seconds=1.0, slow_interval_seconds=10.0, call_timeout_seconds=call_timeout
        ),
        policy=POLICY,
        executor=executor,
        metrics=SelfMetrics(CollectorRegistry(auto_describe=True), backend=backend.name),
        attributor=attributor,  # type: ignore[arg-type]
        wall_clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
    )


async def value(sampler: Sampler, name: str, **labels: str) -> float | None:
    rendered = await sampler.rendered_latest()
    assert rendered is not None
    for family in text_string_to_metric_families(rendered.text.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def sample(sampler: Sampler) -> Snapshot:
    await sampler.sample_slow()
    await sampler.sample_fast()
    await sampler.rendered_latest()
    assert sampler.snapshot is not None
    return sampler.snapshot


async def test_first_complete_sample_makes_it_ready(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    assert not sampler.ready and sampler.rendered is None
    snap = await sample(sampler)
    assert sampler.ready and snap.complete and snap.backend_up
    assert snap.node == "node-1" and snap.taken_at == T0
    assert [g.identity.index for g in snap.gpus] == [0, 1, 2, 3]
    assert all(g.fast is not None and g.slow is not None and g.sampled_at == T0 for g in snap.gpus)
    assert all(g.health.state is HealthState.HEALTHY for g in snap.gpus)
    assert await value(sampler, "gpumon_gpu_temperature_celsius", gpu="0", sensor="gpu") is not None
    assert await value(sampler, "gpumon_exporter_nvml_up") == 1
    assert await value(sampler, "gpumon_exporter_last_sample_timestamp_seconds", cadence="fast") == T0
    assert await value(sampler, "gpumon_exporter_sample_duration_seconds_count", cadence="slow") == 1
    assert await value(sampler, "gpumon_exporter_build_info", backend="simulated") == 1
    # The payload size is the previous render's, so a second render reports the first one's.
    first_size = len(sampler.rendered.text) if sampler.rendered else 0
    await sampler.sample_fast()
    assert await value(sampler, "gpumon_exporter_scrape_bytes") == first_size


async def test_only_a_fast_sample_is_not_complete(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    await sampler.sample_fast()
    assert sampler.snapshot is not None and not sampler.snapshot.complete and not sampler.ready
    assert await sampler.rendered_latest() is not None  # served anyway: partial data beats none


async def test_hung_call_times_out_then_the_gpu_is_skipped_not_piled_up(backend, executor, clocks) -> None:
    # The timeout has to tell a read blocked for 120 s from a healthy read that merely waited
    # for a core: at 50 ms a loaded 2-core machine made healthy reads time out too (hung_calls 2).
    sampler = make_sampler(backend, executor, clocks, call_timeout=1.0)
    await sample(sampler)
    backend.inject(parse_fault({"gpu": 1, "fault": "slow", "seconds": 120}))
    clocks.advance(1)
    snap = await sample(sampler)
    assert not snap.complete and sampler.hung_calls == 1
    hung = snap.gpu(1)
    assert hung is not None and hung.sampled_at == T0  # last data kept, stamped when it was read
    assert all(g.sampled_at == T0 + 1 for g in snap.gpus if g.identity.index != 1)
    assert (
        await value(sampler, "gpumon_exporter_errors_total", source="simulated.read_slow", kind="timeout")
        == 1
    )
    assert await value(sampler, "gpumon_exporter_skipped_reads_total") == 1, (
        "the fast read after the hung slow one"
    )
    for _ in range(3):
        clocks.advance(1)
        await sampler.sample_fast()
    assert await value(sampler, "gpumon_exporter_skipped_reads_total") == 4
    assert sampler.hung_calls == 1, "a hung GPU never gets a second thread"
    assert (
        await value(sampler, "gpumon_exporter_errors_total", source="simulated.read_fast", kind="timeout")
        is None
    )

    backend.inject(parse_fault({"gpu": 1, "fault": "clear"}))  # the blocked read returns
    await _until(lambda: sampler.hung_calls == 0)
    clocks.advance(1)
    snap = await sample(sampler)
    assert snap.complete and sampler.hung_calls == 0
    assert all(g.sampled_at == clocks.wall for g in snap.gpus)


async def test_a_lost_gpu_turns_only_itself_lost(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    await sample(sampler)
    backend.inject(parse_fault({"gpu": 2, "fault": "lost"}))
    snap = await sample(sampler)
    lost = snap.gpu(2)
    assert lost is not None and lost.lost and lost.health.state is HealthState.LOST
    assert lost.fast is None and lost.slow is None
    assert all(g.health.state is HealthState.HEALTHY for g in snap.gpus if g.identity.index != 2)
    assert snap.complete and sampler.ready, "a lost GPU is known, not missing"
    assert await value(sampler, "gpumon_gpu_health", gpu="2", state="lost") == 1
    assert (
        await value(sampler, "gpumon_exporter_errors_total", source="simulated.read_slow", kind="lost") == 1
    )
    backend.inject(parse_fault({"gpu": 2, "fault": "clear"}))
    snap = await sample(sampler)
    back = snap.gpu(2)
    assert back is not None and not back.lost and back.fast is not None


async def test_backend_down_keeps_last_data_and_recovers_with_backoff(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    before = await sample(sampler)
    backend.inject(parse_fault({"fault": "unavailable"}))
    clocks.advance(1)
    await sampler.sample_fast()
    down = sampler.snapshot
    assert down is not None and not down.backend_up and not down.complete and not sampler.ready
    assert [g.fast for g in down.gpus] == [g.fast for g in before.gpus], "last data kept"
    assert await value(sampler, "gpumon_exporter_nvml_up") == 0
    errors = "gpumon_exporter_errors_total"
    assert await value(sampler, errors, source="simulated.read_fast", kind="unavailable") == 1

    # First re-open on the next tick, then 1 s, 2 s, 4 s apart.
    attempts = []
    for _ in range(16):
        clocks.advance(0.5)
        await sampler.sample_fast()
        attempts.append(await value(sampler, errors, source="simulated.open", kind="unavailable"))
    assert attempts == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4]

    backend.clear_all()
    clocks.advance(10)
    snap = await sample(sampler)
    assert snap.backend_up and snap.complete and sampler.ready
    assert await value(sampler, "gpumon_exporter_nvml_up") == 1
    assert [g.identity for g in snap.gpus] == [g.identity for g in before.gpus]


async def test_backend_unavailable_from_the_start(backend, executor, clocks) -> None:
    backend.inject(parse_fault({"fault": "unavailable"}))
    sampler = make_sampler(backend, executor, clocks)
    snap = await sample(sampler)
    assert snap.gpus == () and not snap.backend_up and not sampler.ready
    assert await value(sampler, "gpumon_exporter_nvml_up") == 0, (
        "rendered so Prometheus sees the exporter is up"
    )


async def test_xid_events_from_the_thread_are_counted_and_published(executor, clocks) -> None:
    # The backend stamps events on the node's wall clock, the one the sampler judges them by.
    backend = SimulatedBackend(4, seed=3, clock=lambda: clocks.wall)
    sampler = make_sampler(backend, executor, clocks)
    watcher = sampler.subscribe()
    async with _running(sampler):
        await _until(lambda: sampler.ready)
        while not watcher.queue.empty():  # the first sample's transitions (from nothing)
            watcher.queue.get_nowait()
        for code in (79, 79, 13):
            backend.inject(parse_fault({"gpu": 1, "fault": "xid", "code": code}))
        change = await asyncio.wait_for(watcher.queue.get(), 30)
        assert isinstance(change, HealthChange) and change.sample.identity.index == 1
        assert (
            change.sample.health.state is HealthState.UNHEALTHY and change.sample.health.reason == "XidFatal"
        )
        await _until(
            lambda: sampler.snapshot is not None and sum(sampler.snapshot.gpus[1].xid_counts.values()) == 3
        )
        assert sampler.snapshot is not None
        gpu = sampler.snapshot.gpus[1]
        assert dict(gpu.xid_counts) == {79: 2, 13: 1} and gpu.last_xid == 13
        assert [e.xid for e in gpu.xids] == [13, 79]
        assert await value(sampler, "gpumon_gpu_xid_errors_total", gpu="1", xid="79") == 2
        assert await value(sampler, "gpumon_gpu_xid_errors_total", gpu="1", xid="13") == 1


async def test_xid_verdict_expires_after_the_window_but_the_count_stays(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    await sample(sampler)
    uuid = backend.devices()[0].uuid
    sampler.ingest_xids([XidEvent(uuid, 79, clocks.wall - 5)])  # the backend saw it 5 s ago
    assert sampler.snapshot is not None and sampler.snapshot.gpus[0].health.state is HealthState.UNHEALTHY
    assert sampler.snapshot.gpus[0].xids == (XidEvent(uuid, 79, clocks.wall - 5),), "kept as delivered"
    clocks.advance(POLICY.xid_window_seconds + 1)
    snap = await sample(sampler)
    assert snap.gpus[0].health.state is HealthState.HEALTHY
    assert dict(snap.gpus[0].xid_counts) == {79: 1}
    sampler.ingest_xids([XidEvent("GPU-not-here", 79, 0.0)])
    assert await value(sampler, "gpumon_exporter_errors_total", kind="unknown_gpu") == 1


async def test_watchers_get_transitions_after_each_render(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    watcher = sampler.subscribe()
    await sample(sampler)
    first = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert isinstance(first[0], BackendChange) and first[0].up
    # Each GPU when first seen (slow fields), and again when its first temperature is read.
    assert sorted(e.sample.identity.index for e in first if isinstance(e, HealthChange)) == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    backend.inject(parse_fault({"gpu": 3, "fault": "overheat", "celsius": 99}))
    await sampler.sample_fast()
    (change,) = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert isinstance(change, HealthChange) and change.sample.identity.index == 3
    assert change.previous is not None and change.previous.state is HealthState.HEALTHY
    assert change.sample.health.state is HealthState.UNHEALTHY and change.sample.health.reason == "Thermal"
    await sampler.sample_fast()
    assert watcher.queue.empty(), "no transition, no event"
    sampler.unsubscribe(watcher)
    backend.inject(parse_fault({"gpu": 3, "fault": "clear"}))
    await sampler.sample_fast()
    assert watcher.queue.empty()


class RecordingAttributor:
    def __init__(self) -> None:
        self.refreshes = 0
        self.fail = False

    async def refresh(self) -> None:
        self.refreshes += 1

    def attribute(self, gpus: Sequence[GpuSample]) -> tuple[PodGpuUsage, ...]:
        if self.fail:
            raise RuntimeError("boom")
        g = gpus[0]
        return (
            PodGpuUsage(
                PodRef("ns", "pod-a", "main"), g.identity.index, g.identity.uuid, used_memory_bytes=1
            ),
        )


async def test_pods_are_attributed_every_fast_tick_and_refreshed_on_the_slow_one(
    backend, executor, clocks
) -> None:
    attributor = RecordingAttributor()
    sampler = make_sampler(backend, executor, clocks, attributor=attributor)
    snap = await sample(sampler)
    assert attributor.refreshes == 1
    assert [p.ref.pod for p in snap.pods] == ["pod-a"]
    attributor.fail = True
    await sampler.sample_fast()
    assert sampler.snapshot is not None and [p.ref.pod for p in sampler.snapshot.pods] == ["pod-a"]
    assert (
        await value(sampler, "gpumon_exporter_errors_total", source="pods.attribute", kind="unexpected") == 1
    )


async def test_run_and_shutdown_leave_no_xid_thread(backend, executor, clocks) -> None:
    sampler = make_sampler(backend, executor, clocks)
    async with _running(sampler):
        await _until(lambda: sampler.ready)
    assert sampler._xid_thread is not None and not sampler._xid_thread.is_alive()


class CancellingAttributor(RecordingAttributor):
    """Has the sampler's task cancelled just as the first refresh returns: a shutdown landing in
    the same loop turn as a finishing refresh."""

    def __init__(self) -> None:
        super().__init__()
        self.target: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        await super().refresh()
        if self.refreshes == 1 and self.target is not None:
            asyncio.get_running_loop().call_soon(self.target.cancel)


class CancellingOpenBackend(SimulatedBackend):
    """Has the sampler's task cancelled from the device thread just before ``open`` returns, so
    the cancellation and the call's result reach the loop in the same turn."""

    target: asyncio.Task[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> DriverInfo:
        driver = super().open()
        if self.target is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.target.cancel)
        return driver


async def _assert_stops(task: asyncio.Task[None], sampler: Sampler) -> None:
    try:
        await assert_ends_cancelled(task, "the sampler lost its cancellation and kept sampling")
    finally:
        await sampler.shutdown()


async def test_a_cancel_landing_as_a_pod_refresh_finishes_stops_the_sampler(executor, clocks) -> None:
    # Python 3.11's asyncio.wait_for returned the refresh's result and dropped the cancellation:
    # run() went on for ever, and so did the exporter's shutdown waiting for it.
    attributor = CancellingAttributor()
    sampler = make_sampler(SimulatedBackend(2, seed=1), executor, clocks, attributor=attributor)
    task = attributor.target = asyncio.create_task(sampler.run())
    await _assert_stops(task, sampler)
    assert attributor.refreshes == 1


async def test_a_cancel_landing_as_a_device_call_returns_stops_the_sampler(executor, clocks) -> None:
    backend = CancellingOpenBackend(2, seed=1)
    sampler = make_sampler(backend, executor, clocks)
    task = backend.target = asyncio.create_task(sampler.run())
    backend.loop = asyncio.get_running_loop()
    await _assert_stops(task, sampler)
    assert sampler.snapshot is None  # stopped inside the first tick


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for work done by real threads, polling with a generous deadline."""
    async with asyncio.timeout(30):
        while not condition():  # noqa: ASYNC110 - set by other threads, not by an awaitable
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _running(sampler: Sampler) -> AsyncIterator[None]:
    task = asyncio.create_task(sampler.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sampler.shutdown()


def test_reopen_backoff_doubles_up_to_a_cap() -> None:
    assert [reopen_delay(n) for n in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]


async def test_an_xid_storm_renders_once_per_tick_and_logs_a_bounded_count(
    backend, executor, clocks, caplog
) -> None:
    # Issue #18: every Xid batch re-rendered the whole exposition on the loop and logged a
    # warning per Xid; 5,000 Xids in a second stopped /metrics for 37 s.
    sampler = make_sampler(backend, executor, clocks)
    await sample(sampler)
    uuid = backend.devices()[0].uuid
    publishes = sampler.publishes
    with caplog.at_level("WARNING", logger="gpumon.exporter.sampler"):
        for i in range(5000):
            sampler.ingest_xids([XidEvent(uuid, 1 + i % 999, clocks.wall)])
        assert sampler.publishes == publishes + 1, "the first batch at once, the rest at the next tick"
        assert sampler.snapshot is not None and sum(sampler.snapshot.gpus[0].xid_counts.values()) == 1
        clocks.advance(1.0)
        await sampler.sample_fast()
        assert sampler.snapshot is not None and sum(sampler.snapshot.gpus[0].xid_counts.values()) == 5000
        assert await value(sampler, "gpumon_gpu_xid_errors_total", gpu="0", xid="other") is not None
        assert sampler.rendered is not None
        text = sampler.rendered.text.decode()
        xid_series = [line for line in text.splitlines() if line.startswith("gpumon_gpu_xid_errors_total{")]
        assert len(xid_series) == MAX_XIDS_PER_GPU + 1
        assert len([r for r in caplog.records if r.getMessage() == "Xid event"]) == XID_LOG_BURST
        clocks.advance(XID_LOG_WINDOW_SECONDS)
        await sampler.sample_fast()
    suppressed = [r for r in caplog.records if r.getMessage().startswith("Xid events not logged")]
    assert [r.suppressed for r in suppressed] == [5000 - XID_LOG_BURST]  # type: ignore[attr-defined]
    # Quiet again: the next Xid is rendered (and logged) at once.
    publishes = sampler.publishes
    sampler.ingest_xids([XidEvent(uuid, 79, clocks.wall)])
    assert sampler.publishes == publishes + 1
    assert sampler.snapshot is not None and sum(sampler.snapshot.gpus[0].xid_counts.values()) == 5001


class MigGpmAndVgpuBackend(SimulatedBackend):
    """What NvmlBackend.read_slow returns where the driver answers what NVIDIA's mock stubs:
    GPU 0 in MIG mode, its GPU instance 1 split in two compute instances and instance 2 whole,
    with per-instance GPM (nvmlGpmMigSampleGet); GPU 1 a licensed vGPU, GPU 2 an unlicensed
    one, GPU 3 bare metal."""

    MIGS = (
        MigInstance(1, 0, "1c.3g.40gb", "MIG-a", gpu_instance_profile="3g.40gb"),
        MigInstance(1, 1, "2c.3g.40gb", "MIG-b", gpu_instance_profile="3g.40gb"),
        MigInstance(2, 0, "3g.40gb", "MIG-c", gpu_instance_profile="3g.40gb"),
    )
    GPM = (
        MigProfiling(
            1, "3g.40gb", Profiling(sm_active_ratio=0.5, tensor_active_ratio=0.25, dram_active_ratio=0.1)
        ),
        MigProfiling(2, "3g.40gb", Profiling(sm_active_ratio=0.0)),
    )

    def read_slow(self, index: int) -> SlowFields:
        slow = super().read_slow(index)
        if index == 0:
            return replace(slow, mig_instances=self.MIGS, mig_profiling=self.GPM)
        return replace(slow, vgpu_licensed={1: True, 2: False}.get(index))


async def samples_of(sampler: Sampler, name: str) -> list[dict[str, str]]:
    rendered = await sampler.rendered_latest()
    assert rendered is not None
    return [
        {**s.labels, "value": str(s.value)}
        for family in text_string_to_metric_families(rendered.text.decode())
        for s in family.samples
        if s.name == name
    ]


async def test_gpm_per_mig_instance_and_vgpu_licence_in_both_profiles(executor, clocks) -> None:
    """Per-instance GPM joins the GPU's GPM families with the instance's labels (native:
    gpu_instance and mig_profile, no compute_instance since a GPU instance's sample covers all
    of its compute instances; dcgm: GPU_I_ID and GPU_I_PROFILE, as dcgm-exporter labels MIG
    series); a metric the instance was not answered for is absent. The vGPU licence is 1/0 on
    vGPUs and absent on bare metal."""
    backend = MigGpmAndVgpuBackend(4, seed=3)
    sampler = make_sampler(backend, executor, clocks, profile="both")
    try:
        await sample(sampler)
        sm = await samples_of(sampler, "gpumon_gpu_sm_active_ratio")
        assert sm == [
            {"node": "node-1", "gpu": "0", "uuid": backend.devices()[0].uuid, "gpu_instance": gi,
             "mig_profile": "3g.40gb", "value": v}
            for gi, v in (("1", "0.5"), ("2", "0.0"))
        ]  # fmt: skip
        tensor = await samples_of(sampler, "gpumon_gpu_pipe_active_ratio")
        assert [(t["gpu_instance"], t["pipe"], t["value"]) for t in tensor] == [("1", "tensor", "0.25")]
        assert await samples_of(sampler, "gpumon_gpu_pcie_bytes_per_second") == []

        dcgm = await samples_of(sampler, "DCGM_FI_PROF_DRAM_ACTIVE")
        assert [(d["gpu"], d["GPU_I_ID"], d["GPU_I_PROFILE"], d["value"]) for d in dcgm] == [
            ("0", "1", "3g.40gb", "0.1")
        ]
        assert dcgm[0]["UUID"] == backend.devices()[0].uuid
        assert len(await samples_of(sampler, "DCGM_FI_PROF_SM_ACTIVE")) == 2

        for name in ("gpumon_gpu_vgpu_licensed", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"):
            licensed = {s["gpu"]: s["value"] for s in await samples_of(sampler, name)}
            assert licensed == {"1": "1.0", "2": "0.0"}, name
    finally:
        backend.close()


async def test_an_xid_has_the_recovery_action_read_at_once_not_at_the_next_slow_tick(
    backend, executor, clocks
) -> None:
    sampler = make_sampler(backend, executor, clocks)
    snap = await sample(sampler)
    assert snap.gpus[2].slow is not None and snap.gpus[2].slow.recovery_action is RecoveryAction.NONE
    assert await value(sampler, "gpumon_gpu_recovery_action", gpu="2", action="none") == 1
    # The driver changes its verdict with the Xid (what Xid 154 announces on a real driver).
    backend.inject(parse_fault({"gpu": 2, "fault": "recovery_action", "action": "gpu_reset"}))
    uuid = backend.devices()[2].uuid
    sampler.ingest_xids([XidEvent(uuid, 154, clocks.wall, 2)])
    await _until(
        lambda: (
            sampler.snapshot is not None
            and sampler.snapshot.gpus[2].slow is not None
            and sampler.snapshot.gpus[2].slow.recovery_action is RecoveryAction.GPU_RESET
        )
    )
    gpu = sampler.snapshot.gpus[2]
    assert gpu.health.state is HealthState.UNHEALTHY
    assert [r.code for r in gpu.health.reasons] == ["RecoveryGpuReset"]
    assert await value(sampler, "gpumon_gpu_recovery_action", gpu="2", action="gpu_reset") == 1
    assert await value(sampler, "gpumon_gpu_recovery_action", gpu="2", action="none") == 0
    assert await value(sampler, "gpumon_gpu_recovery_action", gpu="1", action="none") == 1, (
        "other GPUs as read"
    )

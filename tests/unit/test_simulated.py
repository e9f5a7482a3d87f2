"""The simulated GPUs: specs, deterministic load, processes, faults, scenarios."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpumon.config import ConfigError
from gpumon.devices.backend import BackendUnavailable, GpuLostError
from gpumon.devices.simulated import (
    MODELS,
    LostFault,
    SimProcess,
    SimulatedBackend,
    SimulationError,
    load_scenario,
    parse_fault,
)
from gpumon.gpu.model import RecoveryAction

MiB = 1 << 20
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(gpus: int = 4, model: str = "A100-SXM4-80GB", **kw: object) -> tuple[SimulatedBackend, Clock]:
    clock = Clock()
    b = SimulatedBackend(gpus, model, clock=clock, **kw)  # type: ignore[arg-type]
    b.open()
    return b, clock


@pytest.mark.parametrize(
    ("model", "memory_gib", "power_limit", "max_sm_mhz", "memory_temperature"),
    [
        ("A100-SXM4-80GB", 80, 400, 1410, True),
        ("H100-80GB-HBM3", 79.6, 700, 1980, True),
        ("T4", 15, 70, 1590, False),
        ("L40S", 45, 350, 2520, False),
    ],
)
def test_models_look_like_their_datasheets(
    model: str, memory_gib: float, power_limit: float, max_sm_mhz: float, memory_temperature: bool
) -> None:
    b, clock = backend(8, model)
    assert [g.index for g in b.devices()] == list(range(8))
    assert all(g.model == f"NVIDIA {model}" for g in b.devices())
    assert len({g.uuid for g in b.devices()}) == 8
    for step in range(0, 3600, 97):
        clock.t = T0 + step
        for i in range(8):
            f = b.read_fast(i)
            assert f.memory is not None and f.memory.reserved_bytes is not None
            assert f.memory.total_bytes == pytest.approx(memory_gib * 1024 * MiB, rel=0.01)
            assert f.memory.used_bytes + f.memory.free_bytes + f.memory.reserved_bytes == f.memory.total_bytes
            assert f.memory.free_bytes >= 0
            assert f.utilization_ratio is not None and 0 <= f.utilization_ratio <= 1
            assert f.power_watts is not None and 0 < f.power_watts <= power_limit
            assert f.power_limit_watts == power_limit
            assert f.sm_clock_hertz is not None and 0 < f.sm_clock_hertz <= max_sm_mhz * 1e6
            assert f.temperature_gpu_celsius is not None and 20 <= f.temperature_gpu_celsius <= 85
            assert (f.temperature_memory_celsius is not None) == memory_temperature
            assert sum(p.used_memory_bytes or 0 for p in f.processes) == f.memory.used_bytes


def test_load_is_a_function_of_seed_and_clock() -> None:
    a, clock_a = backend(seed=7)
    b, clock_b = backend(seed=7)
    other, clock_o = backend(seed=8)
    for t in (0.0, 12.5, 600.0, 5000.0):
        clock_a.t = clock_b.t = clock_o.t = T0 + t
        fa, fb = a.read_fast(2), b.read_fast(2)
        assert (fa.utilization_ratio, fa.temperature_gpu_celsius, fa.processes) == (
            fb.utilization_ratio,
            fb.temperature_gpu_celsius,
            fb.processes,
        )
    assert a.devices() == b.devices() != other.devices()


def test_load_varies_over_time_and_across_gpus() -> None:
    b, clock = backend(8)
    series = []
    for step in range(0, 7200, 30):
        clock.t = T0 + step
        series.append(tuple(b.read_fast(i).utilization_ratio for i in range(8)))
    per_gpu = list(zip(*series, strict=True))
    assert all(len(set(s)) > 10 for s in per_gpu if any(s)), "load should move"
    assert len(set(per_gpu)) == 8, "GPUs should not move in lockstep"
    idle = [u for s in per_gpu for u in s if u == 0]
    assert 0 < len(idle) < len(series) * 8, "some GPUs idle some of the time, not all"


def test_energy_counts_up_with_power() -> None:
    b, clock = backend()
    first = b.read_fast(0)
    clock.t += 10
    second = b.read_fast(0)
    assert first.energy_joules is not None and second.energy_joules is not None
    assert second.energy_joules - first.energy_joules == pytest.approx(
        (second.power_watts or 0) * 10, rel=0.01
    )


def test_stated_processes_replace_the_generated_workload() -> None:
    procs = {1: [SimProcess(pid=4242, used_memory_bytes=20 * 1024 * MiB, sm_share=0.6, name="train")]}
    b, _ = backend(processes=procs)
    f = b.read_fast(1)
    assert [(p.pid, p.used_memory_bytes, p.sm_utilization_ratio, p.name) for p in f.processes] == [
        (4242, 20 * 1024 * MiB, 0.6, "train")
    ]
    assert f.utilization_ratio == 0.6
    assert f.memory is not None and f.memory.used_bytes == 20 * 1024 * MiB
    b.set_processes(1, [])
    assert b.read_fast(1).processes == () and b.read_fast(1).utilization_ratio == 0
    b.set_processes(1, None)
    assert b.read_fast(1).processes != ()
    with pytest.raises(SimulationError, match="more memory"):
        b.set_processes(0, [SimProcess(1, 200 * 1024 * MiB, 0.5)])


def test_xid_fault_is_delivered_once_with_the_gpu_identity() -> None:
    b, _ = backend()
    b.inject(parse_fault({"gpu": 2, "fault": "xid", "code": 79}))
    events = b.wait_xids(0)
    assert [(e.index, e.uuid, e.xid, e.timestamp) for e in events] == [(2, b.devices()[2].uuid, 79, T0)]
    assert b.wait_xids(0) == []


def test_wait_xids_blocks_until_a_fault_delivers() -> None:
    b, _ = backend()
    waiting = threading.Event()
    got: list[int] = []

    def waiter() -> None:
        waiting.set()
        got.extend(e.xid for e in b.wait_xids(30))

    t = threading.Thread(target=waiter)
    t.start()
    assert waiting.wait(5)
    b.inject(parse_fault({"gpu": 0, "fault": "xid", "code": 31}))
    t.join(10)
    assert not t.is_alive() and got == [31]


def test_lost_gpu_raises_only_for_itself_until_cleared() -> None:
    b, _ = backend()
    b.inject(LostFault(gpu=1, fault="lost"))
    with pytest.raises(GpuLostError) as exc:
        b.read_fast(1)
    assert exc.value.index == 1
    with pytest.raises(GpuLostError):
        b.read_slow(1)
    b.read_fast(0)
    assert [e.xid for e in b.wait_xids(0)] == [79]
    b.inject(parse_fault({"gpu": 1, "fault": "clear"}))
    b.read_fast(1)


def test_ecc_and_remap_faults_show_in_slow_fields_with_their_xids() -> None:
    b, _ = backend()
    assert b.read_slow(0).ecc_uncorrected == 0
    b.inject(parse_fault({"gpu": 0, "fault": "ecc", "count": 3}))
    b.inject(parse_fault({"gpu": 3, "fault": "remap"}))
    assert b.read_slow(0).ecc_uncorrected == 3
    slow = b.read_slow(3)
    assert slow.row_remap_failure is True and slow.remapped_rows_uncorrectable == 1
    assert [(e.index, e.xid) for e in b.wait_xids(0)] == [(0, 48), (3, 64)]
    b.inject(parse_fault({"gpu": 0, "fault": "clear"}))
    assert b.read_slow(0).ecc_uncorrected == 0


def test_the_driver_recovery_action_is_set_by_a_fault_and_a_reset_sets_it_back() -> None:
    b, _ = backend()
    assert b.read_slow(1).recovery_action is RecoveryAction.NONE
    b.inject(parse_fault({"gpu": 1, "fault": "recovery_action", "action": "node_reboot"}))
    assert b.read_recovery_action(1) is RecoveryAction.NODE_REBOOT
    assert b.read_slow(1).recovery_action is RecoveryAction.NODE_REBOOT
    assert b.read_recovery_action(0) is RecoveryAction.NONE, "per GPU"
    assert b.status().active == {1: ("recovery action node_reboot",)}
    b.inject(parse_fault({"gpu": 1, "fault": "clear"}))
    assert b.read_recovery_action(1) is RecoveryAction.NONE
    with pytest.raises(SimulationError, match="not a recovery action"):
        parse_fault({"gpu": 1, "fault": "recovery_action", "action": "GPU_RESET"})


def test_remap_needs_an_ampere_or_later_board() -> None:
    b, _ = backend(model="T4")
    assert b.read_slow(0).row_remap_failure is None
    with pytest.raises(SimulationError, match="row remapping"):
        b.inject(parse_fault({"gpu": 0, "fault": "remap"}))


def test_overheat_raises_temperature_and_throttles() -> None:
    b, _ = backend()
    before = b.read_fast(0)
    b.inject(parse_fault({"gpu": 0, "fault": "overheat", "celsius": 99}))
    hot = b.read_fast(0)
    assert hot.temperature_gpu_celsius == 99
    assert hot.throttle_reasons is not None and {"hw_thermal", "sw_thermal"} <= hot.throttle_reasons
    assert (hot.sm_clock_hertz or 0) < (before.sm_clock_hertz or 0) or before.utilization_ratio == 0
    assert b.status().active == {0: ("overheat 99 C",)}


def test_slow_read_blocks_and_clear_releases_it() -> None:
    b, _ = backend()
    b.inject(parse_fault({"gpu": 1, "fault": "slow", "seconds": 60}))
    started, done = threading.Event(), threading.Event()

    def read() -> None:
        started.set()
        b.read_fast(1)
        done.set()

    t = threading.Thread(target=read)
    t.start()
    assert started.wait(5)
    b.read_fast(0)  # other GPUs are not held up
    assert not done.is_set()
    b.inject(parse_fault({"gpu": 1, "fault": "clear"}))
    assert done.wait(10)
    t.join()


def test_unavailable_driver_fails_every_call_until_cleared() -> None:
    b, _ = backend()
    b.inject(parse_fault({"fault": "unavailable"}))
    for call in (b.open, b.devices, lambda: b.read_fast(0), lambda: b.wait_xids(0)):
        with pytest.raises(BackendUnavailable):
            call()
    b.clear_all()
    assert len(b.devices()) == 4


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"gpu": 1, "fault": "xid"}, "xid.code: Field required"),
        ({"gpu": 1, "fault": "boom"}, "does not match any of the expected tags"),
        ({"gpu": -1, "fault": "lost"}, "lost.gpu: Input should be greater than or equal to 0"),
        ({"gpu": 0, "fault": "slow", "secs": 3}, "slow.secs: Extra inputs are not permitted"),
    ],
)
def test_bad_fault_requests_are_named(request_body: dict[str, object], message: str) -> None:
    with pytest.raises(SimulationError, match="invalid fault") as exc:
        parse_fault(request_body)
    assert message in str(exc.value)


def test_faults_on_missing_gpus_are_refused() -> None:
    b, _ = backend(2)
    with pytest.raises(SimulationError, match="gpu 5 does not exist"):
        b.inject(parse_fault({"gpu": 5, "fault": "lost"}))
    with pytest.raises(SimulationError, match="unknown GPU model 'V100'"):
        SimulatedBackend(2, "V100")


def test_scenario_applies_faults_at_their_time(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        """
faults:
  - {at: 5, gpu: 1, fault: xid, code: 79}
  - {at: 10, gpu: 2, fault: overheat, celsius: 98}
  - {at: 30, gpu: 2, fault: clear}
processes:
  - {gpu: 0, pid: 4242, name: python, used_memory_mib: 1024, sm_share: 0.5}
mig:
  - {gpu: 3, profiles: [3g.40gb, 3g.40gb]}
"""
    )
    clock = Clock()
    b = SimulatedBackend(4, clock=clock, scenario=load_scenario(path))
    b.open()
    assert [p.pid for p in b.read_fast(0).processes] == [4242]
    assert b.devices()[3].mig_mode is True and b.devices()[0].mig_mode is False
    assert [m.profile for m in b.read_slow(3).mig_instances] == ["3g.40gb", "3g.40gb"]
    assert b.wait_xids(0) == []
    clock.t = T0 + 5
    assert [(e.index, e.xid) for e in b.wait_xids(0)] == [(1, 79)]
    clock.t = T0 + 12
    assert b.read_fast(2).temperature_gpu_celsius == 98
    clock.t = T0 + 30
    assert b.read_fast(2).temperature_gpu_celsius != 98


def test_wait_xids_wakes_for_the_next_scenario_fault(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("faults: [{at: 0.05, gpu: 0, fault: xid, code: 13}]\n")
    b = SimulatedBackend(1, scenario=load_scenario(path))  # the real clock: a waiter must wake by itself
    b.open()
    got: list[int] = []
    t = threading.Thread(target=lambda: got.extend(e.xid for e in b.wait_xids(60)))
    t.start()
    t.join(20)  # far less than the 60 s asked for: only the scenario's due time can end the wait
    assert not t.is_alive() and got == [13]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("faults: [{gpu: 1, fault: lost}]", "faults.0.at: Field required"),
        ("faults: [{at: 1, gpu: 1, fault: melt}]", "does not match any of the expected tags"),
        (
            "faults: [{at: -1, gpu: 1, fault: lost}]",
            "faults.0.at: Input should be greater than or equal to 0",
        ),
        ("faults: [{at: 1, gpu: 1, fault: xid, code: 0}]", "faults.0.spec.xid.code"),
        ("mig: [{gpu: 0, profiles: []}]", "mig.0.profiles"),
        ("fault: []", "fault: Extra inputs are not permitted"),
        ("faults: [", "is not valid YAML"),
    ],
)
def test_bad_scenarios_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert message in str(exc.value) and str(path) in str(exc.value)


def test_scenario_must_fit_the_node(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("faults: [{at: 1, gpu: 9, fault: lost}]\n")
    with pytest.raises(SimulationError, match="gpu 9 does not exist"):
        SimulatedBackend(4, scenario=load_scenario(path))
    path.write_text("mig: [{gpu: 0, profiles: [7g.80gb, 1g.10gb]}]\n")
    with pytest.raises(SimulationError, match="more than the 7 slices"):
        SimulatedBackend(4, scenario=load_scenario(path))
    with pytest.raises(SimulationError, match="does not support MIG"):
        SimulatedBackend(4, "T4", scenario=load_scenario(path))


def test_every_model_is_known_by_name() -> None:
    assert {"A100-SXM4-80GB", "H100-80GB-HBM3", "T4", "L40S"} <= set(MODELS)


def test_an_xid_storm_delivers_its_rate_as_events_fall_due_then_ends() -> None:
    b, clock = backend(4)
    b.inject(parse_fault({"fault": "xid_storm", "rate": 5000, "seconds": 2, "min_code": 1, "max_code": 999}))
    clock.t += 0.5
    first = b.wait_xids(0)
    assert len(first) == 2500
    assert {e.index for e in first} == {0, 1, 2, 3} and all(1 <= e.xid <= 999 for e in first)
    assert len({e.xid for e in first}) > 500, "codes are spread over the range"
    clock.t += 10  # past the end: the rest of the storm, then nothing
    assert len(b.wait_xids(0)) == 7500
    assert b.wait_xids(0) == []
    with pytest.raises(SimulationError, match="min_code"):
        parse_fault({"fault": "xid_storm", "rate": 1, "seconds": 1, "min_code": 9, "max_code": 1})

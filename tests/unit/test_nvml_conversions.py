"""The NVML backend's functional core (convert, errors), fed with nvidia-ml-py's own constants and
ctypes structs."""

from __future__ import annotations

import math
from pathlib import Path

import pynvml
import pytest

from gpumon.devices.backend import BackendUnavailable, GpuLostError
from gpumon.devices.nvml.convert import (
    FI_GPU_RECOVERY_ACTION,
    GPM_METRICS,
    GPM_MIG_METRICS,
    THROTTLE_REASONS,
    canonical_bus_id,
    cuda_version,
    field_value,
    fold_process_utilization,
    gpm_value,
    gpu_instance_profiles,
    hertz,
    joules,
    memory_info,
    merge_enumeration,
    mig_memory_gb,
    mig_profile_name,
    nvlink_counters,
    nvlink_rate,
    nvlink_requests,
    performance_state,
    placeholder_identity,
    process_samples,
    profiling,
    ratio,
    recovery_action,
    seconds,
    text,
    throttle_reasons,
    vgpu_licensed,
    watts,
    xid_event,
)
from gpumon.devices.nvml.errors import (
    ErrorClass,
    classify_error,
    error_kind,
    init_failure_message,
    read_failure,
)
from gpumon.gpu.model import (
    GpuIdentity,
    MemoryInfo,
    MigInstance,
    ProcessSample,
    Profiling,
    RecoveryAction,
    XidEvent,
)

GiB = 2**30
MiB = 2**20


# -- clock event reasons ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bitmask", "names"),
    [
        (0, set()),
        (pynvml.nvmlClocksEventReasonGpuIdle, {"gpu_idle"}),
        (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, {"applications_clocks_setting"}),
        (pynvml.nvmlClocksEventReasonSwPowerCap, {"sw_power_cap"}),
        (pynvml.nvmlClocksEventReasonHwSlowdown, {"hw_slowdown"}),
        (pynvml.nvmlClocksEventReasonSyncBoost, {"sync_boost"}),
        (pynvml.nvmlClocksEventReasonSwThermalSlowdown, {"sw_thermal"}),
        (pynvml.nvmlClocksEventReasonHwThermalSlowdown, {"hw_thermal"}),
        (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, {"hw_power_brake"}),
        (pynvml.nvmlClocksEventReasonDisplayClockSetting, {"display_clock_setting"}),
        (
            pynvml.nvmlClocksEventReasonSwThermalSlowdown
            | pynvml.nvmlClocksEventReasonHwThermalSlowdown
            | pynvml.nvmlClocksEventReasonSwPowerCap,
            {"sw_thermal", "hw_thermal", "sw_power_cap"},
        ),
    ],
)
def test_clock_event_reasons_by_name(bitmask: int, names: set[str]) -> None:
    assert throttle_reasons(bitmask) == names


def test_every_named_reason_is_reachable_and_unknown_bits_are_ignored() -> None:
    assert throttle_reasons(pynvml.nvmlClocksEventReasonAll) == THROTTLE_REASONS
    # Bits this version of gpumon does not name (board limit, reliability) are left out.
    assert throttle_reasons(pynvml.nvmlClocksThrottleReasonBoardLimit) == frozenset()
    assert throttle_reasons(pynvml.nvmlClocksThrottleReasonReliability | 1) == {"gpu_idle"}


# -- units ---------------------------------------------------------------------------------------


def test_units_become_base_units() -> None:
    assert watts(72_000) == 72.0
    assert watts(123_456) == pytest.approx(123.456)
    assert joules(600_000) == 600.0
    assert hertz(1410) == 1_410_000_000.0
    assert ratio(37) == pytest.approx(0.37)


def test_memory_info_v2_keeps_reserved_apart() -> None:
    mem = pynvml.c_nvmlMemory_v2_t()
    mem.version = pynvml.nvmlMemory_v2
    used = 40 * GiB - 583 * MiB - 30 * GiB
    mem.total, mem.reserved, mem.free, mem.used = 40 * GiB, 583 * MiB, 30 * GiB, used
    assert memory_info(mem) == MemoryInfo(
        total_bytes=40 * GiB,
        used_bytes=used,
        free_bytes=30 * GiB,
        reserved_bytes=583 * MiB,
    )


def test_memory_info_v1_has_no_reserved_figure() -> None:
    mem = pynvml.c_nvmlMemory_t()
    mem.total, mem.free, mem.used = 16 * GiB, 10 * GiB, 6 * GiB
    assert memory_info(mem) == MemoryInfo(16 * GiB, 6 * GiB, 10 * GiB, reserved_bytes=None)


@pytest.mark.parametrize(
    ("encoded", "version"), [(12040, "12.4"), (11080, "11.8"), (13000, "13.0"), (12090, "12.9")]
)
def test_cuda_version(encoded: int, version: str) -> None:
    assert cuda_version(encoded) == version


def test_text_accepts_bytes_and_str() -> None:
    assert text(b"12.550.163.01") == "12.550.163.01"
    assert text("550.163.01") == "550.163.01"


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("00000000:07:00.0", "00000000:07:00.0"),
        ("0000:07:00.0", "00000000:07:00.0"),
        ("0000:0f:00.0", "00000000:0F:00.0"),
        ("07:00.0", "00000000:07:00.0"),
        ("0001:B7:00.0", "00000001:B7:00.0"),
    ],
)
def test_bus_ids_are_spelled_like_nvml(raw: str, canonical: str) -> None:
    assert canonical_bus_id(raw) == canonical


def test_pci_info_struct_bus_id_reads_back_as_text() -> None:
    info = pynvml.nvmlPciInfo_t()
    info.busId = b"00000000:4E:00.0"
    assert canonical_bus_id(text(info.busId)) == "00000000:4E:00.0"


@pytest.mark.parametrize(
    ("value_type", "member", "raw", "expected"),
    [
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 31, 31.0),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40, float(2**40)),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -5, -5.0),
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 41.5, 41.5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 77, 77.0),
    ],
)
def test_field_values_are_read_through_their_type(
    value_type: int, member: str, raw: float, expected: float
) -> None:
    fv = pynvml.c_nvmlFieldValue_t()
    fv.fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
    fv.valueType = value_type
    setattr(fv.value, member, raw)
    assert field_value(fv) == expected


def test_field_value_of_unknown_type_is_absent() -> None:
    fv = pynvml.c_nvmlFieldValue_t()
    fv.valueType = pynvml.NVML_VALUE_TYPE_COUNT
    assert field_value(fv) is None


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "klass"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, ErrorClass.UNSUPPORTED),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, ErrorClass.UNSUPPORTED),
        (pynvml.NVML_ERROR_GPU_IS_LOST, ErrorClass.LOST),
        (pynvml.NVML_ERROR_UNINITIALIZED, ErrorClass.UNAVAILABLE),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, ErrorClass.UNAVAILABLE),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, ErrorClass.UNAVAILABLE),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, ErrorClass.UNAVAILABLE),
        (pynvml.NVML_ERROR_TIMEOUT, ErrorClass.FAILED),
        (pynvml.NVML_ERROR_UNKNOWN, ErrorClass.FAILED),
        (pynvml.NVML_ERROR_NO_PERMISSION, ErrorClass.FAILED),
        (pynvml.NVML_ERROR_CORRUPTED_INFOROM, ErrorClass.FAILED),
    ],
)
def test_error_classes(code: int, klass: ErrorClass) -> None:
    assert classify_error(code) is klass


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pynvml.NVMLError_Timeout, "timeout"),
        (pynvml.NVMLError_Unknown, "unknown"),
        (pynvml.NVMLError_NoPermission, "no_permission"),
        (pynvml.NVMLError_GpuIsLost, "gpu_is_lost"),
        (pynvml.NVMLError_InsufficientPower, "insufficient_power"),
        (pynvml.NVMLError_ResetRequired, "reset_required"),
    ],
)
def test_error_kind_follows_the_error_class(error: type[pynvml.NVMLError], kind: str) -> None:
    assert error_kind(error().value) == kind


def test_unknown_error_code_still_gets_a_kind() -> None:
    assert error_kind(4242) == "nvml_error_4242"


def test_read_failure_not_supported_is_silent() -> None:
    assert read_failure(3, "temperature", pynvml.NVML_ERROR_NOT_SUPPORTED) is None
    assert read_failure(3, "temperature", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) is None


def test_read_failure_lost_fails_that_gpu_only() -> None:
    outcome = read_failure(3, "memory", pynvml.NVML_ERROR_GPU_IS_LOST)
    assert isinstance(outcome, GpuLostError)
    assert outcome.index == 3


def test_read_failure_without_a_gpu_reports_lost_instead() -> None:
    assert read_failure(None, "xid", pynvml.NVML_ERROR_GPU_IS_LOST) == ("nvml.xid", "gpu_is_lost")


def test_read_failure_driver_gone_fails_the_backend() -> None:
    outcome = read_failure(0, "power", pynvml.NVML_ERROR_UNINITIALIZED)
    assert isinstance(outcome, BackendUnavailable)
    assert "uninitialized" in str(outcome)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_TIMEOUT, "timeout"),
        (pynvml.NVML_ERROR_UNKNOWN, "unknown"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission"),
    ],
)
def test_read_failure_other_errors_are_reported_by_field(code: int, kind: str) -> None:
    assert read_failure(1, "power_limit", code) == ("nvml.power_limit", kind)


def test_init_failure_messages_name_the_cause() -> None:
    missing = init_failure_message(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, None)
    assert "libnvidia-ml.so.1 not found" in missing and "LD_LIBRARY_PATH" in missing
    with_path = init_failure_message(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, Path("/opt/x/libnvidia-ml.so"))
    assert "/opt/x/libnvidia-ml.so" in with_path and "SONAME" in with_path
    assert "kernel driver is not loaded" in init_failure_message(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, None)
    assert "permission" in init_failure_message(pynvml.NVML_ERROR_NO_PERMISSION, None)
    assert "(unknown)" in init_failure_message(pynvml.NVML_ERROR_UNKNOWN, None)
    for code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH):
        assert "\n" not in init_failure_message(code, None)


def test_a_library_that_is_there_but_refused_is_not_called_missing() -> None:
    """pynvml answers LIBRARY_NOT_FOUND to any load failure; the loader's message tells a file
    that is not there from one that is there and refused."""
    not_found = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    refused = init_failure_message(not_found, None, "/usr/lib64/libnvidia-ml.so.1: invalid ELF header")
    assert refused == (
        "NVML unavailable: libnvidia-ml.so.1 is there but cannot be loaded: "
        "/usr/lib64/libnvidia-ml.so.1: invalid ELF header"
    )
    dependency = "libnvidia-ml-dep.so: cannot open shared object file: No such file or directory"
    assert "is there but cannot be loaded: libnvidia-ml-dep.so" in init_failure_message(
        not_found, None, dependency
    )
    absent = "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"
    assert init_failure_message(not_found, None, absent) == init_failure_message(not_found, None)


# -- processes ----------------------------------------------------------------------------------


def _util_sample(pid: int, ts: int, sm: int, mem: int) -> pynvml.c_nvmlProcessUtilizationSample_t:
    s = pynvml.c_nvmlProcessUtilizationSample_t()
    s.pid, s.timeStamp, s.smUtil, s.memUtil = pid, ts, sm, mem
    return s


def _process(pid: int, used: int) -> pynvml.c_nvmlProcessInfo_v3_t:
    p = pynvml.c_nvmlProcessInfo_v3_t()
    p.pid, p.usedGpuMemory = pid, used
    return p


def test_process_utilization_averages_the_new_samples_per_pid() -> None:
    samples = [
        _util_sample(100, 1_000, 40, 10),
        _util_sample(100, 1_500, 60, 30),
        _util_sample(200, 1_200, 5, 1),
        _util_sample(300, 900, 99, 99),  # older than last seen: already counted
    ]
    by_pid, last_seen = fold_process_utilization(samples, last_seen_us=950)
    assert by_pid == {
        100: (pytest.approx(0.5), pytest.approx(0.2)),
        200: (pytest.approx(0.05), pytest.approx(0.01)),
    }
    assert last_seen == 1_500


def test_process_utilization_bookkeeping_across_ticks() -> None:
    first, seen = fold_process_utilization([_util_sample(7, 10, 20, 0)], 0)
    again, seen_again = fold_process_utilization([_util_sample(7, 10, 20, 0)], seen)
    assert first == {7: (pytest.approx(0.2), 0.0)}
    assert again == {} and seen_again == seen == 10


def test_empty_sample_slots_are_ignored() -> None:
    # A zeroed buffer entry (pid 0, timestamp 0) is not a process.
    by_pid, seen = fold_process_utilization([pynvml.c_nvmlProcessUtilizationSample_t()], 0)
    assert by_pid == {} and seen == 0


def test_process_samples_join_lists_and_utilization() -> None:
    compute = [_process(100, 2 * GiB), _process(300, 512 * MiB)]
    graphics = [_process(200, 64 * MiB), _process(100, 2 * GiB)]
    samples = process_samples(compute, graphics, {100: (0.5, 0.25)})
    assert samples == (
        ProcessSample(100, 2 * GiB, sm_utilization_ratio=0.5, memory_utilization_ratio=0.25),
        ProcessSample(200, 64 * MiB, sm_utilization_ratio=0.0, memory_utilization_ratio=0.0),
        ProcessSample(300, 512 * MiB, sm_utilization_ratio=0.0, memory_utilization_ratio=0.0),
    )


def test_process_samples_without_utilization_support() -> None:
    unknown = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    samples = process_samples([_process(42, unknown)], [], None)
    assert samples == (ProcessSample(42, None, sm_utilization_ratio=None, memory_utilization_ratio=None),)


def test_process_samples_carry_their_mig_instance_on_a_mig_gpu() -> None:
    inside, outside = _process(100, GiB), _process(200, GiB)
    inside.gpuInstanceId, inside.computeInstanceId = 7, 0
    outside.gpuInstanceId = outside.computeInstanceId = 0xFFFFFFFF
    samples = process_samples([inside, outside], [], None, mig=True)
    assert [(s.pid, s.gpu_instance, s.compute_instance) for s in samples] == [(100, 7, 0), (200, None, None)]
    # Without MIG the IDs mean nothing (NVIDIA's mock library writes 0 there).
    assert process_samples([inside], [], None)[0].gpu_instance is None


# -- MIG ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gi", "ci", "memory_mb", "board_bytes", "name"),
    [
        # A100-SXM4-40GB (NVIDIA MIG user guide, supported profiles)
        (1, 1, 4864, 40 * GiB, "1g.5gb"),
        (1, 1, 9856, 40 * GiB, "1g.10gb"),
        (2, 2, 9856, 40 * GiB, "2g.10gb"),
        (3, 3, 19968, 40 * GiB, "3g.20gb"),
        (7, 7, 40192, 40 * GiB, "7g.40gb"),
        (3, 1, 19968, 40 * GiB, "1c.3g.20gb"),
        # H100 80GB HBM3: 81559 MiB on the board
        (1, 1, 9984, 81559 * MiB, "1g.10gb"),
        (3, 3, 40192, 81559 * MiB, "3g.40gb"),
        (7, 7, 80896, 81559 * MiB, "7g.80gb"),
        (7, 0, 80896, 81559 * MiB, "7g.80gb"),
    ],
)
def test_mig_profile_names(gi: int, ci: int, memory_mb: int, board_bytes: int, name: str) -> None:
    attrs = pynvml.c_nvmlDeviceAttributes()
    attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB = gi, ci, memory_mb
    assert (
        mig_profile_name(
            gi_slices=attrs.gpuInstanceSliceCount,
            ci_slices=attrs.computeInstanceSliceCount,
            instance_memory_mb=attrs.memorySizeMB,
            device_memory_bytes=board_bytes,
        )
        == name
    )


def test_mig_memory_rounds_up_to_eighths_of_the_board() -> None:
    assert mig_memory_gb(40 * GiB, 4864) == 5
    assert mig_memory_gb(40 * GiB, 5121) == 10  # a hair over an eighth is a quarter


# -- Xid events ---------------------------------------------------------------------------------


def test_xid_event_from_event_data() -> None:
    data = pynvml.c_nvmlEventData_t()
    data.eventType, data.eventData = pynvml.nvmlEventTypeXidCriticalError, 79
    assert xid_event(data.eventType, data.eventData, "GPU-1", 1, now=1000.5) == XidEvent(
        uuid="GPU-1", xid=79, timestamp=1000.5, index=1
    )


def test_other_events_are_not_xids() -> None:
    data = pynvml.c_nvmlEventData_t()
    data.eventType, data.eventData = pynvml.nvmlEventTypeDoubleBitEccError, 1
    assert xid_event(data.eventType, data.eventData, "GPU-1", 1, now=0.0) is None


# -- enumeration across re-initialisation ---------------------------------------------------------


def _card(index: int, bus: str, uuid: str | None = None) -> GpuIdentity:
    return GpuIdentity(index=index, uuid=uuid or f"GPU-{bus}", model="NVIDIA A100-SXM4-40GB", pci_bus_id=bus)


BUS = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0"]


def test_first_enumeration_takes_nvml_indices() -> None:
    found = [_card(0, BUS[0]), _card(1, BUS[1]), _card(2, BUS[2])]
    assert merge_enumeration((), found) == tuple((c, c.index) for c in found)


def test_a_card_keeps_its_index_when_the_driver_renumbers() -> None:
    before = (_card(0, BUS[0]), _card(1, BUS[1]), _card(2, BUS[2]))
    # After a driver reload without the middle card, NVML numbers the third one 1.
    merged = merge_enumeration(before, [_card(0, BUS[0]), _card(1, BUS[2])])
    assert [(g.index, g.pci_bus_id, nvml) for g, nvml in merged] == [
        (0, BUS[0], 0),
        (1, BUS[1], None),  # gone: kept, to be reported lost
        (2, BUS[2], 1),
    ]


def test_identity_fields_are_refreshed_but_not_the_index() -> None:
    before = (_card(0, BUS[0], uuid="GPU-old"),)
    ((card, nvml),) = merge_enumeration(before, [_card(0, BUS[0], uuid="GPU-new")])
    assert card.uuid == "GPU-new" and card.index == 0 and nvml == 0


def test_a_new_card_on_a_taken_index_goes_after_the_others() -> None:
    before = (_card(0, BUS[0]), _card(1, BUS[1]))
    merged = merge_enumeration(before, [_card(0, BUS[0]), _card(1, BUS[2])])
    assert [(g.index, g.pci_bus_id, nvml) for g, nvml in merged] == [
        (0, BUS[0], 0),
        (1, BUS[1], None),
        (2, BUS[2], 1),
    ]


def test_unreadable_gpu_becomes_a_placeholder() -> None:
    merged = merge_enumeration((), [_card(0, BUS[0]), 1, _card(2, BUS[2])])
    assert merged == ((_card(0, BUS[0]), 0), (placeholder_identity(1), 1), (_card(2, BUS[2]), 2))


def test_unreadable_gpu_is_the_missing_known_card_not_a_second_one() -> None:
    before = (_card(0, BUS[0]), _card(1, BUS[1]))
    merged = merge_enumeration(before, [_card(0, BUS[0]), 1])
    assert merged == ((_card(0, BUS[0]), 0), (_card(1, BUS[1]), None))


def test_a_readable_again_gpu_replaces_its_placeholder() -> None:
    first = merge_enumeration((), [_card(0, BUS[0]), 1])
    known = tuple(g for g, _ in first if g.pci_bus_id)
    merged = merge_enumeration(known, [_card(0, BUS[0]), _card(1, BUS[1])])
    assert merged == ((_card(0, BUS[0]), 0), (_card(1, BUS[1]), 1))


# -- GPM -------------------------------------------------------------------------------------------


def test_gpm_activity_is_a_ratio_and_traffic_bytes_per_second() -> None:
    """NVML answers activity in percent of the interval and traffic in MiB/s (nvml.h)."""
    assert gpm_value("tensor_active_ratio", 40.0) == 0.4
    assert gpm_value("pcie_tx_bytes_per_second", 1638.4) == 1638.4 * MiB
    assert gpm_value("nvlink_rx_bytes_per_second", 0.0) == 0.0


def test_every_profiling_field_has_a_gpm_metric() -> None:
    assert set(GPM_METRICS) == set(Profiling.__slots__)
    assert len(set(GPM_METRICS.values())) == len(GPM_METRICS)


TX, RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
REPLAY, CRC = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC
RECOVERY = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY


def test_nvlink_requests_every_counter_of_every_link_in_one_call() -> None:
    requests = nvlink_requests(2)
    assert len(requests) == 2 * 5 and len(set(requests)) == 10
    assert {link for _, link in requests} == {0, 1}
    assert {(TX, 1), (RX, 0), (REPLAY, 1), (RECOVERY, 0), (CRC, 1)} <= set(requests)
    assert nvlink_requests(0) == []


def test_nvlink_data_is_summed_over_links_in_bytes_and_errors_stay_per_link() -> None:
    """THROUGHPUT_DATA is per link (scopeId) in KiB; nvml.h's UINT_MAX aggregate is their sum."""
    ok = pynvml.NVML_SUCCESS
    got = nvlink_counters(
        [(TX, 0, ok, 10.0), (TX, 1, ok, 5.0), (RX, 0, ok, 1.0), (RX, 1, ok, 2.0),
         (REPLAY, 0, ok, 3.0), (REPLAY, 1, ok, 0.0), (CRC, 1, ok, 7.0)]
    )  # fmt: skip
    assert got.data_bytes == {"tx": 15 * 1024, "rx": 3 * 1024}
    assert got.errors == {(0, "replay"): 3, (1, "replay"): 0, (1, "crc"): 7}
    assert got.failed == {}


def test_nvlink_counters_unanswered_are_left_out_and_named_once() -> None:
    """A direction some link did not answer is left out whole (a partial sum would read as a
    counter reset); an error counter a link does not report is absent for that link only."""
    ok, unsupported = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED
    got = nvlink_counters(
        [(TX, 0, ok, 10.0), (TX, 1, unsupported, None), (RX, 0, ok, 1.0), (RX, 1, ok, 1.0),
         (REPLAY, 0, unsupported, None), (REPLAY, 1, unsupported, None), (CRC, 0, ok, 2.0)]
    )  # fmt: skip
    assert got.data_bytes == {"rx": 2 * 1024}
    assert got.errors == {(0, "crc"): 2}
    assert got.failed == {"nvlink.tx": unsupported, "nvlink.replay": unsupported}


def test_nvlink_rate_between_two_readings() -> None:
    assert nvlink_rate(None, 10.0, 4096) is None  # the first reading has no interval
    assert nvlink_rate((0.0, 1024), 10.0, 1024 + 10 * 2048) == 2048.0
    assert nvlink_rate((10.0, 1024), 10.0, 2048) is None  # no time between the two
    assert nvlink_rate((0.0, 4096), 10.0, 1024) is None  # the counter went back: a reset


def test_profiling_from_one_metrics_answer() -> None:
    ok = pynvml.NVML_SUCCESS
    answer = [(name, ok, 50.0) for name in GPM_METRICS]
    result, failed = profiling(answer)
    assert failed == {}
    assert result.graphics_active_ratio == result.dram_active_ratio == 0.5
    assert result.pcie_rx_bytes_per_second == result.nvlink_tx_bytes_per_second == 50 * MiB


def test_profiling_leaves_unanswered_metrics_out_and_names_them() -> None:
    """A metric this GPU does not offer (FP64 on a board without it) is absent, not 0."""
    answer = [
        ("tensor_active_ratio", pynvml.NVML_SUCCESS, 12.5),
        ("fp64_active_ratio", pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0),
        ("fp16_active_ratio", pynvml.NVML_ERROR_UNKNOWN, 99.0),
    ]
    result, failed = profiling(answer)
    assert result == Profiling(tensor_active_ratio=0.125)
    assert failed == {
        "fp64_active_ratio": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "fp16_active_ratio": pynvml.NVML_ERROR_UNKNOWN,
    }


def test_profiling_leaves_non_finite_answers_out() -> None:
    """NaN or infinity answered with success is no reading: the snapshot's strict JSON refuses it."""
    ok = pynvml.NVML_SUCCESS
    answer = [
        ("sm_active_ratio", ok, math.nan),
        ("dram_active_ratio", ok, math.inf),
        ("tensor_active_ratio", ok, 25.0),
    ]
    result, failed = profiling(answer)
    assert result == Profiling(tensor_active_ratio=0.25)
    assert failed == {}


@pytest.mark.parametrize(
    ("pstate", "expected"), [(0, 0), (8, 8), (15, 15), (pynvml.NVML_PSTATE_UNKNOWN, None)]
)
def test_performance_state(pstate: int, expected: int | None) -> None:
    assert performance_state(pstate) == expected


def test_recovery_action_is_nvmls_number_and_an_unknown_one_is_no_reading() -> None:
    assert recovery_action(float(pynvml.NVML_GPU_RECOVERY_ACTION_NONE)) is RecoveryAction.NONE
    assert (
        recovery_action(float(pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET))
        is RecoveryAction.DRAIN_AND_RESET
    )
    assert (
        recovery_action(float(pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT)) is RecoveryAction.SYSTEM_REBOOT
    )
    assert recovery_action(8.0) is None
    assert FI_GPU_RECOVERY_ACTION == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def test_violation_time_is_seconds() -> None:
    assert seconds(2_500_000_000) == 2.5


# -- vGPU licence: the NVML structs pynvml defines, read as DCGM reads them ----------------------

VGPU = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
RTX = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_NVIDIA_RTX


def _licensable(supported: bool, *features: tuple[int, int], count: int | None = None) -> object:
    """A ``c_nvmlGridLicensableFeatures_v4_t`` as nvmlDeviceGetGridLicensableFeatures_v4 fills
    it: (featureCode, featureState) per listed feature."""
    out = pynvml.c_nvmlGridLicensableFeatures_v4_t()
    out.isGridLicenseSupported = int(supported)
    out.licensableFeaturesCount = len(features) if count is None else count
    for slot, (code, state) in zip(out.gridLicensableFeatures, features, strict=False):
        slot.featureCode, slot.featureState = code, state
        slot.productName = b"NVIDIA Virtual Compute Server"
    return out


def test_a_licensed_vgpu_reads_licensed() -> None:
    assert vgpu_licensed(_licensable(True, (VGPU, 1))) is True


def test_an_unlicensed_vgpu_reads_unlicensed() -> None:
    """featureState 0: the vGPU feature is listed but its licence is not held (expired, no
    licence server): DCGM's 0."""
    assert vgpu_licensed(_licensable(True, (RTX, 1), (VGPU, 0))) is False


def test_no_grid_licence_support_reads_unlicensed_as_dcgm_does() -> None:
    assert vgpu_licensed(_licensable(False, (VGPU, 1))) is False


def test_no_vgpu_feature_listed_is_no_reading() -> None:
    """Only the vGPU feature counts (a vWS/RTX licence is another product); DCGM stores nothing."""
    assert vgpu_licensed(_licensable(True, (RTX, 1))) is None
    assert vgpu_licensed(_licensable(True)) is None


def test_only_the_listed_features_are_read() -> None:
    """licensableFeaturesCount bounds the array: a slot past it is not a feature, and a count
    beyond the array's three slots reads the three."""
    assert vgpu_licensed(_licensable(True, (RTX, 1), (VGPU, 1), count=1)) is None
    assert vgpu_licensed(_licensable(True, (RTX, 0), (RTX, 0), (VGPU, 1), count=99)) is True


# -- GPM per MIG GPU instance ---------------------------------------------------------------------


def test_a_gpu_instance_is_asked_what_dcgm_serves_per_instance() -> None:
    """DCGM serves engine, pipe and DRAM activity per GPU instance; PCIe and NVLink traffic per
    GPU only (dcgm_fields.cpp entity levels)."""
    assert set(GPM_MIG_METRICS) == set(GPM_METRICS) - {
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
        "nvlink_tx_bytes_per_second",
        "nvlink_rx_bytes_per_second",
    }
    assert all(GPM_MIG_METRICS[name] == GPM_METRICS[name] for name in GPM_MIG_METRICS)


def test_gpu_instance_profiles_from_their_compute_instances() -> None:
    """Two compute instances of GPU instance 1 (3g.20gb) and a whole GPU instance 5: one profile
    per GPU instance, the GPU instance's own (the simulator gives none: its compute instances
    span their GPU instance, so theirs is the same)."""
    migs = [
        MigInstance(1, 0, "1c.3g.20gb", "MIG-a", gpu_instance_profile="3g.20gb"),
        MigInstance(1, 1, "2c.3g.20gb", "MIG-b", gpu_instance_profile="3g.20gb"),
        MigInstance(5, 0, "2g.10gb", "MIG-c"),
    ]
    assert gpu_instance_profiles(migs) == {1: "3g.20gb", 5: "2g.10gb"}

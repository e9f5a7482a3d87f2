"""Per-GPU health judgement, a pure function of a sample, recent Xids, policy and time.

The exporter's own verdict (``gpumon_gpu_health``); the controller applies its own rules on
top. Xid classes follow NVIDIA's Xid catalog: some codes are informational (application
faults such as 13, 31, 43, 45, 68, 109), the rest call for action. Every class can be
overridden through :class:`HealthPolicy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpumon.devices.model import (
    HEALTHY,
    FastFields,
    HealthReason,
    HealthState,
    HealthVerdict,
    SlowFields,
    XidEvent,
)

# Xids that describe application faults or recoverable events: counted, never acted on.
INFORMATIONAL_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# Xids that call for action, with the state they put the GPU in and a reason code.
# 48: double-bit ECC; 63: row remap recorded (reset needed); 64: row remap failure;
# 74: NVLink error; 79: fallen off the bus; 92: high single-bit ECC rate;
# 94: contained ECC error; 95: uncontained ECC error; 119/120: GSP RPC timeout / error.
ACTION_XIDS: Mapping[int, tuple[HealthState, str]] = MappingProxyType(
    {
        48: (HealthState.UNHEALTHY, "EccUncorrectable"),
        63: (HealthState.DEGRADED, "RowRemapPending"),
        64: (HealthState.UNHEALTHY, "RowRemapFailure"),
        74: (HealthState.UNHEALTHY, "XidFatal"),
        79: (HealthState.UNHEALTHY, "XidFatal"),
        92: (HealthState.DEGRADED, "EccHighSingleBitRate"),
        94: (HealthState.DEGRADED, "EccContained"),
        95: (HealthState.UNHEALTHY, "EccUncorrectable"),
        119: (HealthState.UNHEALTHY, "XidFatal"),
        120: (HealthState.UNHEALTHY, "XidFatal"),
    }
)


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Knobs of the exporter's verdict; built from config at the edge."""

    # Per-Xid overrides: code -> state ("healthy" makes a code informational).
    xid_overrides: Mapping[int, HealthState] = field(default_factory=dict)
    # Any Xid not in either table counts as this state.
    unknown_xid_state: HealthState = HealthState.DEGRADED
    # How long an actionable Xid keeps its verdict after it was seen.
    xid_window_seconds: float = 600.0
    temperature_degraded_celsius: float = 87.0
    temperature_unhealthy_celsius: float = 95.0


def classify_xid(xid: int, policy: HealthPolicy) -> tuple[HealthState, str]:
    """The state an Xid puts a GPU in, and the reason code for it."""
    if xid in policy.xid_overrides:
        state = policy.xid_overrides[xid]
        if state is HealthState.HEALTHY:
            return state, "XidInformational"
        code = ACTION_XIDS.get(xid, (state, "XidFatal" if state.rank >= 2 else "Xid"))[1]
        return state, code
    if xid in INFORMATIONAL_XIDS:
        return HealthState.HEALTHY, "XidInformational"
    if xid in ACTION_XIDS:
        return ACTION_XIDS[xid]
    return policy.unknown_xid_state, "XidUnknown"


def judge(
    *,
    fast: FastFields | None,
    slow: SlowFields | None,
    recent_xids: Iterable[XidEvent],
    lost: bool,
    now: float,
    policy: HealthPolicy,
) -> HealthVerdict:
    """The worst of every finding, with all reasons kept (worst first)."""
    if lost:
        return HealthVerdict(
            HealthState.LOST,
            (HealthReason("GpuLost", "GPU is lost (NVML_ERROR_GPU_IS_LOST)", HealthState.LOST),),
        )
    reasons: list[HealthReason] = []
    seen_xids: set[int] = set()
    for ev in recent_xids:
        if now - ev.timestamp > policy.xid_window_seconds or ev.xid in seen_xids:
            continue
        seen_xids.add(ev.xid)
        state, code = classify_xid(ev.xid, policy)
        if state is not HealthState.HEALTHY:
            reasons.append(HealthReason(code, f"Xid {ev.xid}", state))
    if slow is not None:
        if slow.ecc_uncorrected:
            reasons.append(
                HealthReason(
                    "EccUncorrectable",
                    f"{slow.ecc_uncorrected} uncorrectable ECC errors (volatile)",
                    HealthState.UNHEALTHY,
                )
            )
        if slow.row_remap_failure:
            reasons.append(HealthReason("RowRemapFailure", "row remapping failed", HealthState.UNHEALTHY))
        elif slow.row_remap_pending:
            reasons.append(
                HealthReason("RowRemapPending", "row remap pending: reset the GPU", HealthState.DEGRADED)
            )
    if fast is not None:
        temp = fast.temperature_gpu_celsius
        if temp is not None and temp >= policy.temperature_unhealthy_celsius:
            reasons.append(HealthReason("Thermal", f"temperature {temp:.0f} C", HealthState.UNHEALTHY))
        elif temp is not None and temp >= policy.temperature_degraded_celsius:
            reasons.append(HealthReason("Thermal", f"temperature {temp:.0f} C", HealthState.DEGRADED))
        elif fast.throttle_reasons and "hw_thermal" in fast.throttle_reasons:
            reasons.append(HealthReason("Thermal", "hardware thermal slowdown", HealthState.DEGRADED))
    if not reasons:
        return HEALTHY
    reasons.sort(key=lambda r: -r.state.rank)
    return HealthVerdict(reasons[0].state, tuple(reasons))

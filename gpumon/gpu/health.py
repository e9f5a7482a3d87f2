"""One judgement of a GPU, below both programs: the Xid catalog, the reason codes with their
recommended actions, the classification of an Xid, the exporter's verdict, and the terms the
controller's rules are written in (:class:`Signal`, :class:`Scope`, :class:`Op`,
:class:`Severity`), here so that the config layer and the controller's pure core share them
without the core importing the config layer's file reading.

Pure: no I/O, no clock (``now`` is a parameter). Both programs classify through here with the
same :class:`HealthPolicy`, built from the ``health:`` config section by its one converter
(:meth:`gpumon.config.HealthConfig.policy`): the exporter's verdict (``gpumon_gpu_health``,
for dashboards) and the controller's rules (which decide actions) can therefore never disagree
about what an Xid means. Xid classes follow NVIDIA's Xid catalog: some codes are informational
(application faults such as 13, 31, 43, 45, 68, 109), the rest call for action; every class can
be overridden through :class:`HealthPolicy`.

The exporter grades a GPU in four :class:`HealthState` levels; the controller acts on two
:class:`Severity` levels. :meth:`Severity.of` is the one mapping between them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpumon.gpu.model import (
    HEALTHY,
    FastFields,
    HealthReason,
    HealthState,
    HealthVerdict,
    SlowFields,
    XidEvent,
)


class Signal(enum.StrEnum):
    """The evidence about a GPU that a controller rule reads. ``promql`` rules carry their own
    query (Prometheus source only)."""

    TEMPERATURE = "temperature"
    XID = "xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ROW_REMAP_FAILURE = "row_remap_failure"
    GPU_LOST = "gpu_lost"
    MEMORY_UTILIZATION = "memory_utilization"
    EXPORTER_HEALTH = "exporter_health"
    PROMQL = "promql"


class Scope(enum.StrEnum):
    """What a controller rule judges: each GPU, or the node as a whole."""

    GPU = "gpu"
    NODE = "node"


class Op(enum.StrEnum):
    """How a controller rule compares its signal with its threshold."""

    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    EQ = "=="
    NE = "!="


class Severity(enum.StrEnum):
    """What the controller acts on: degraded -> PreferNoSchedule, unhealthy -> NoSchedule."""

    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"

    @property
    def rank(self) -> int:
        return 1 if self is Severity.DEGRADED else 2

    @staticmethod
    def of(state: HealthState) -> Severity | None:
        """The severity of a health state: none for healthy; a lost GPU is unhealthy (the
        taint and drain are the same, the reason code says it is lost)."""
        if state is HealthState.HEALTHY:
            return None
        return Severity.DEGRADED if state is HealthState.DEGRADED else Severity.UNHEALTHY


# ---------------------------------------------------------------------------------------------
# Reason codes: the one table


@dataclass(frozen=True, slots=True)
class ReasonCode:
    """A condition reason (``GpuUnhealthy``'s reason, a health reason's code)."""

    action: str  # recommended to a person, in the condition message
    # Rules on this signal report this reason unless they name one (xid rules report the
    # reason of the Xid's class, below).
    default_for: Signal | None = None


REASONS: Mapping[str, ReasonCode] = MappingProxyType(
    {
        "XidFatal": ReasonCode(
            "drain the node, reset the GPU (nvidia-smi -r) or reboot; replace it if the Xid recurs",
            Signal.XID,
        ),
        "EccUncorrectable": ReasonCode(
            "reset the GPU to retire the bad pages; replace it if uncorrectable errors recur",
            Signal.ECC_UNCORRECTABLE,
        ),
        "EccContained": ReasonCode("reset the GPU when idle; replace it if errors recur"),
        "EccHighSingleBitRate": ReasonCode("schedule a GPU reset; watch for uncorrectable errors"),
        "RowRemapFailure": ReasonCode("replace the GPU: row remapping has failed", Signal.ROW_REMAP_FAILURE),
        "RowRemapPending": ReasonCode("reset the GPU to apply the pending row remap"),
        "GpuLost": ReasonCode("reboot the node; replace the GPU if it is lost again", Signal.GPU_LOST),
        "Thermal": ReasonCode(
            "check cooling, airflow and fans; the GPU is at or near its thermal limit", Signal.TEMPERATURE
        ),
        "Xid": ReasonCode("look the Xid up in NVIDIA's Xid catalog; reset the GPU if it recurs"),
        "XidUnknown": ReasonCode("look the Xid up in NVIDIA's Xid catalog; reset the GPU if it recurs"),
        "XidInformational": ReasonCode("none: an application fault, not the GPU's"),
        "MemoryUtilization": ReasonCode("investigate the GPU", Signal.MEMORY_UTILIZATION),
        "ExporterVerdict": ReasonCode("investigate the GPU", Signal.EXPORTER_HEALTH),
        "Custom": ReasonCode("investigate the GPU", Signal.PROMQL),
    }
)

_DEFAULT_ACTION = "investigate the GPU"
_SIGNAL_REASONS: Mapping[Signal, str] = MappingProxyType(
    {rc.default_for: code for code, rc in REASONS.items() if rc.default_for is not None}
)


def recommended_action(reason: str) -> str:
    """The action for a reason code; a rule's own reason gets a generic one."""
    rc = REASONS.get(reason)
    return rc.action if rc is not None else _DEFAULT_ACTION


def default_reason(signal: Signal) -> str:
    return _SIGNAL_REASONS[signal]


# ---------------------------------------------------------------------------------------------
# The Xid catalog


@dataclass(frozen=True, slots=True)
class XidClass:
    """What an Xid means for the GPU: the state it puts it in, and the reason code."""

    state: HealthState
    reason: str

    @property
    def severity(self) -> Severity | None:
        return Severity.of(self.state)


# Xids that describe application faults or recoverable events: counted, never acted on.
INFORMATIONAL_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# Xids that call for action. 48: double-bit ECC; 63: row remap recorded (reset needed);
# 64: row remap failure; 74: NVLink error; 79: fallen off the bus; 92: high single-bit ECC
# rate; 94: contained ECC error; 95: uncontained ECC error; 119/120: GSP RPC timeout / error.
ACTION_XIDS: Mapping[int, XidClass] = MappingProxyType(
    {
        48: XidClass(HealthState.UNHEALTHY, "EccUncorrectable"),
        63: XidClass(HealthState.DEGRADED, "RowRemapPending"),
        64: XidClass(HealthState.UNHEALTHY, "RowRemapFailure"),
        74: XidClass(HealthState.UNHEALTHY, "XidFatal"),
        79: XidClass(HealthState.UNHEALTHY, "XidFatal"),
        92: XidClass(HealthState.DEGRADED, "EccHighSingleBitRate"),
        94: XidClass(HealthState.DEGRADED, "EccContained"),
        95: XidClass(HealthState.UNHEALTHY, "EccUncorrectable"),
        119: XidClass(HealthState.UNHEALTHY, "XidFatal"),
        120: XidClass(HealthState.UNHEALTHY, "XidFatal"),
    }
)

_INFORMATIONAL = XidClass(HealthState.HEALTHY, "XidInformational")


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The configured judgement, shared by the exporter and the controller; built from the
    ``health:`` config section by :meth:`gpumon.config.HealthConfig.policy`."""

    # Per-Xid overrides: code -> state ("healthy" makes a code informational).
    xid_overrides: Mapping[int, HealthState] = field(default_factory=lambda: MappingProxyType({}))
    # Any Xid not in either table counts as this state.
    unknown_xid_state: HealthState = HealthState.DEGRADED
    # How long an actionable Xid keeps its verdict after it was seen.
    xid_window_seconds: float = 600.0
    temperature_degraded_celsius: float = 87.0
    temperature_unhealthy_celsius: float = 95.0


def classify_xid(xid: int, policy: HealthPolicy) -> XidClass:
    """The class of an Xid under ``policy``: the catalog, with the configured overrides."""
    state = policy.xid_overrides.get(xid)
    if state is not None:
        if state is HealthState.HEALTHY:
            return _INFORMATIONAL
        catalog = ACTION_XIDS.get(xid)
        reason = catalog.reason if catalog is not None else ("XidFatal" if state.rank >= 2 else "Xid")
        return XidClass(state, reason)
    if xid in INFORMATIONAL_XIDS:
        return _INFORMATIONAL
    return ACTION_XIDS.get(xid) or XidClass(policy.unknown_xid_state, "XidUnknown")


def actionable_xids(codes: Iterable[int], policy: HealthPolicy) -> list[tuple[int, XidClass]]:
    """The codes that call for action with their classes, worst first (then by code): the one
    order in which both the exporter's verdict and the controller's findings name them."""
    classes = [(c, classify_xid(c, policy)) for c in sorted(set(codes))]
    actionable = [(c, k) for c, k in classes if k.state is not HealthState.HEALTHY]
    return sorted(actionable, key=lambda ck: -ck[1].state.rank)


# ---------------------------------------------------------------------------------------------
# The exporter's verdict


def _xid_reasons(ranked: list[tuple[int, XidClass]]) -> list[HealthReason]:
    """One reason per class (reason code and state) naming its codes ("Xid 74, 79"), in
    ``ranked``'s order: a GPU's reasons are bounded by the classes, not by the codes seen, so a
    storm of distinct codes neither grows ``gpumon_gpu_health_info`` by a series per code nor
    pushes the verdict past the wire's ``MAX_REASONS``. The controller names its evidence the
    same way."""
    codes: dict[XidClass, list[int]] = {}
    for code, cls in ranked:
        codes.setdefault(cls, []).append(code)
    return [
        HealthReason(cls.reason, "Xid " + ", ".join(map(str, cs)), cls.state) for cls, cs in codes.items()
    ]


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
    in_window = (ev.xid for ev in recent_xids if now - ev.timestamp <= policy.xid_window_seconds)
    reasons = _xid_reasons(actionable_xids(in_window, policy))
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

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
    RecoveryAction,
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
    RECOVERY_ACTION = "recovery_action"
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
        # The driver's recovery action, one reason per action so the condition names it.
        "GpuRecoveryAction": ReasonCode(
            "do what the driver's recovery action asks (gpumon_gpu_recovery_action)", Signal.RECOVERY_ACTION
        ),
        "RecoveryGpuReset": ReasonCode("the driver asks for a GPU reset: drain the GPU, then reset it"),
        "RecoveryNodeReboot": ReasonCode("the driver asks for a node reboot: drain the node, then reboot it"),
        "RecoveryDrainP2p": ReasonCode("the driver asks that peer-to-peer work on the GPU be drained"),
        "RecoveryDrainAndReset": ReasonCode(
            "the GPU runs at reduced capacity: drain it, then reset it to regain the rest"
        ),
        "RecoveryImexDomain": ReasonCode("the driver asks for the GPU's IMEX domain to be recovered"),
        "RecoveryBusReset": ReasonCode("the driver asks for a reset of the GPU's PCIe bus"),
        "RecoverySystemReboot": ReasonCode("the driver asks for a full system reboot"),
    }
)

# The reason a recovery action other than NONE is reported under.
RECOVERY_REASONS: Mapping[RecoveryAction, str] = MappingProxyType(
    {
        RecoveryAction.GPU_RESET: "RecoveryGpuReset",
        RecoveryAction.NODE_REBOOT: "RecoveryNodeReboot",
        RecoveryAction.DRAIN_P2P: "RecoveryDrainP2p",
        RecoveryAction.DRAIN_AND_RESET: "RecoveryDrainAndReset",
        RecoveryAction.RECOVER_IMEX_DOMAIN: "RecoveryImexDomain",
        RecoveryAction.BUS_RESET: "RecoveryBusReset",
        RecoveryAction.SYSTEM_REBOOT: "RecoverySystemReboot",
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


# Xids that describe application faults or recoverable events: counted, never acted on. 154
# announces that the driver's recovery action changed: the action itself is judged (the exporter
# reads it again at once), so the code adds nothing to the verdict.
INFORMATIONAL_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109, 154})

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

# What stands in for the driver's recovery action where the driver does not report it: the
# immediate action NVIDIA's Xid catalog documents for each code that calls for action, as the
# action that comes closest (a GPU off the bus cannot be reset from the host: the node is
# rebooted). Codes whose documented action is to restart the application are left out.
XID_RESOLUTIONS: Mapping[int, RecoveryAction] = MappingProxyType(
    {
        48: RecoveryAction.GPU_RESET,
        63: RecoveryAction.GPU_RESET,
        64: RecoveryAction.GPU_RESET,
        74: RecoveryAction.GPU_RESET,
        79: RecoveryAction.NODE_REBOOT,
        95: RecoveryAction.GPU_RESET,
        119: RecoveryAction.GPU_RESET,
        120: RecoveryAction.GPU_RESET,
    }
)


# Where no Xid within the window documents one, the finding's reason does, by the same
# catalog: a volatile uncorrectable ECC count or a pending remap is cleared by a reset, a lost GPU
# by a reboot. Thermal and custom findings call for no recovery.
REASON_RESOLUTIONS: Mapping[str, RecoveryAction] = MappingProxyType(
    {
        "XidFatal": RecoveryAction.GPU_RESET,
        "EccUncorrectable": RecoveryAction.GPU_RESET,
        "EccContained": RecoveryAction.GPU_RESET,
        "EccHighSingleBitRate": RecoveryAction.GPU_RESET,
        "RowRemapPending": RecoveryAction.GPU_RESET,
        "RowRemapFailure": RecoveryAction.GPU_RESET,
        "GpuLost": RecoveryAction.NODE_REBOOT,
    }
)


def documented_resolution(
    codes: Iterable[int], *, lost: bool = False, reasons: Iterable[str] = ()
) -> RecoveryAction:
    """The recovery that the Xid catalog documents for ``codes`` (a lost GPU's is a reboot), or
    else for the findings' ``reasons``, the heaviest of them; NONE when none documents one."""
    actions = [XID_RESOLUTIONS[c] for c in codes if c in XID_RESOLUTIONS]
    if not actions:
        actions = [REASON_RESOLUTIONS[r] for r in reasons if r in REASON_RESOLUTIONS]
    if lost:
        actions.append(RecoveryAction.NODE_REBOOT)
    return max(actions, key=_heaviness, default=RecoveryAction.NONE)


def _heaviness(action: RecoveryAction) -> int:
    return 2 if action in (RecoveryAction.NODE_REBOOT, RecoveryAction.SYSTEM_REBOOT) else 1


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
        action = slow.recovery_action
        if action is not None and action is not RecoveryAction.NONE:
            reasons.append(
                HealthReason(
                    RECOVERY_REASONS[action], f"driver recovery action {action.name}", HealthState.UNHEALTHY
                )
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

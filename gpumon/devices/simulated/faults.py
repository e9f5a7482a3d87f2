"""Faults of simulated GPUs: what can be injected, in the validated shape of a request (a scenario
file's entry, an HTTP body, the CLI's), and what is wrong with each GPU now."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from gpumon.config.files import format_validation_error
from gpumon.config.numbers import Float, Int
from gpumon.devices.simulated.boards import SimulationError
from gpumon.gpu.model import RecoveryAction


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)


class XidFault(_Fault):
    """Deliver one Xid event."""

    fault: Literal["xid"]
    code: Int = Field(ge=1, le=999)


class EccFault(_Fault):
    """Uncorrectable (double-bit) ECC errors, delivered with Xid 48 as the driver does."""

    fault: Literal["ecc"]
    count: Int = Field(1, ge=1)


class RemapFault(_Fault):
    """Row remapping failed (no spare rows left), delivered with Xid 64."""

    fault: Literal["remap"]


class LostFault(_Fault):
    """The GPU fell off the bus: every read raises GPU_IS_LOST; Xid 79 is delivered."""

    fault: Literal["lost"]


class OverheatFault(_Fault):
    """Temperature held at ``celsius`` with thermal slowdown active and clocks halved."""

    fault: Literal["overheat"]
    celsius: Float = Field(97.0, gt=0, lt=200)


class SlowFault(_Fault):
    """Every read of this GPU blocks ``seconds`` (a hung driver call); cleared reads return at once."""

    fault: Literal["slow"]
    seconds: Float = Field(5.0, gt=0, le=3600)


def _action(value: Any) -> Any:
    return RecoveryAction.from_label(value) if isinstance(value, str) else value


class RecoveryActionFault(_Fault):
    """The driver asks for ``action`` (NVML's GPU recovery action, by name: ``gpu_reset``,
    ``node_reboot``, ...) until a reset (``clear``) or another of these sets it."""

    fault: Literal["recovery_action"]
    action: Annotated[RecoveryAction, BeforeValidator(_action)]


class ClearFault(_Fault):
    """A GPU reset: faults removed, volatile ECC counters and remap state cleared."""

    fault: Literal["clear"]


class UnavailableFault(BaseModel):
    """The driver goes away for the whole node: every call raises BackendUnavailable until cleared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: Literal["unavailable"]


class XidStormFault(BaseModel):
    """A driver gone wrong: ``rate`` Xid events a second for ``seconds``, each on a GPU and with a
    code (``min_code`` to ``max_code``) drawn at random, delivered as they fall due. One entry
    stands for thousands, so a storm needs neither a scenario line nor a request per Xid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: Literal["xid_storm"]
    rate: Float = Field(gt=0, le=100_000)
    seconds: Float = Field(gt=0, le=3600)
    min_code: Int = Field(1, ge=0, le=99_999)
    max_code: Int = Field(999, ge=0, le=99_999)

    @model_validator(mode="after")
    def _codes_ordered(self) -> XidStormFault:
        if self.min_code > self.max_code:
            raise ValueError("min_code must not be above max_code")
        return self


FaultSpec = Annotated[
    XidFault
    | EccFault
    | RemapFault
    | LostFault
    | OverheatFault
    | SlowFault
    | RecoveryActionFault
    | ClearFault
    | UnavailableFault
    | XidStormFault,
    Field(discriminator="fault"),
]
FAULT_KINDS: tuple[str, ...] = (
    "xid",
    "ecc",
    "remap",
    "lost",
    "overheat",
    "slow",
    "recovery_action",
    "clear",
    "unavailable",
    "xid_storm",
)
fault_adapter: TypeAdapter[FaultSpec] = TypeAdapter(FaultSpec)


def parse_fault(data: Any) -> FaultSpec:
    """Validate one fault request; :class:`SimulationError` with a readable message otherwise."""
    try:
        return fault_adapter.validate_python(data)
    except ValidationError as e:
        entries = format_validation_error(e).removeprefix("invalid configuration:\n")
        raise SimulationError(f"invalid fault:\n{entries}") from None


@dataclass(slots=True)
class GpuFaults:
    """What is wrong with one simulated GPU now (the backend's, changed under its lock)."""

    lost: bool = False
    overheat_celsius: float | None = None
    slow_seconds: float | None = None
    # Set by clear/close so a read blocked by a slow fault returns at once.
    release: threading.Event = field(default_factory=threading.Event)
    ecc_uncorrected: int = 0
    remap_failures: int = 0
    recovery_action: RecoveryAction = RecoveryAction.NONE


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One entry of the injection log shown by ``GET /api/v1/faults``."""

    at: float
    spec: FaultSpec


@dataclass(frozen=True, slots=True)
class FaultStatus:
    """What is wrong with the simulated node right now."""

    unavailable: bool
    active: Mapping[int, tuple[str, ...]]  # gpu index -> active fault descriptions
    injected: tuple[InjectedFault, ...]


def describe(f: GpuFaults) -> tuple[str, ...]:
    out: list[str] = []
    if f.lost:
        out.append("lost")
    if f.overheat_celsius is not None:
        out.append(f"overheat {f.overheat_celsius:g} C")
    if f.slow_seconds is not None:
        out.append(f"slow {f.slow_seconds:g} s")
    if f.ecc_uncorrected:
        out.append(f"ecc {f.ecc_uncorrected} uncorrected")
    if f.remap_failures:
        out.append("remap failure")
    if f.recovery_action is not RecoveryAction.NONE:
        out.append(f"recovery action {f.recovery_action.label}")
    return tuple(out)

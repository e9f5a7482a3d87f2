"""A pool's repair ladder as declared in config (``pools[].repair``; docs/controller.md,
"Repair"): opt-in, one section per pool. Declarations only, validated when config loads;
gpumon.controller.configure turns one into the planner's frozen ``RepairPolicy``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gpumon.config.section import Section
from gpumon.configtypes import Float, Int

RepairStep = Literal["reset", "reboot", "replace"]
_LADDER: list[RepairStep] = ["reset", "reboot", "replace"]


class RepairConfig(Section):
    # The rungs gpumon may climb, lightest first; leaving one out skips it.
    steps: list[RepairStep] = Field(default_factory=lambda: list(_LADDER), min_length=1)
    # Replace the machine at once instead of resetting or rebooting it.
    replace_immediately: bool = False
    # Attempts of each step before the ladder moves on.
    max_attempts: Int = Field(1, ge=1, le=5)
    # Nodes of the pool repairing at once.
    max_concurrent: Int = Field(1, ge=1)
    # From a step's start until the exporter reports the GPUs healthy with action NONE.
    reset_deadline_seconds: Float = Field(600.0, gt=0)
    reboot_deadline_seconds: Float = Field(1800.0, gt=0)
    replace_deadline_seconds: Float = Field(3600.0, gt=0)
    # How long a step waits for the pods to leave, from the quarantine, before it escalates.
    free_deadline_seconds: Float = Field(1800.0, gt=0)
    # A GPU faulting again this soon after its repair: the machine is replaced.
    flap_window_seconds: Float = Field(86400.0, gt=0)

    @field_validator("steps")
    @classmethod
    def _once_each(cls, v: list[RepairStep]) -> list[RepairStep]:
        if len(set(v)) != len(v):
            raise ValueError("each step at most once")
        return v

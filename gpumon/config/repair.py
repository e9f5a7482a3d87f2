"""A pool's repair ladder as declared in config (``pools[].repair``; docs/controller.md,
"Repair"): opt-in, one section per pool. Declarations only, validated when config loads;
gpumon.controller.configure turns one into the planner's frozen ``RepairPolicy``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gpumon.config.numbers import Float, Int
from gpumon.config.section import Section

RepairStep = Literal["reset", "reboot", "replace"]
_LADDER: list[RepairStep] = ["reset", "reboot", "replace"]


class RepairJobConfig(Section):
    """A node-local step, run as a Job pinned to the node: the pod template (a PodTemplateSpec,
    ``{metadata: ..., spec: {containers: [...]}}``). gpumon adds the node pinning, a toleration
    of its quarantine taint and of the cordon, ``restartPolicy: Never``, the step's deadline, and
    to every container the environment ``GPUMON_NODE``, ``GPUMON_GPU_UUIDS`` (comma-separated:
    the GPUs the step is for) and ``GPUMON_RECOVERY_ACTION``. Anything privileged is the
    template's own: it is the only place a privilege is granted."""

    template: dict[str, Any]

    @field_validator("template")
    @classmethod
    def _pod_template(cls, v: dict[str, Any]) -> dict[str, Any]:
        spec = v.get("spec")
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(containers, list) or not containers:
            raise ValueError("spec.containers: a pod template with at least one container")
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                raise ValueError(f"spec.containers.{i}: needs a name and an image")
        return v


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
    # The node-local steps' Jobs (the chart's defaults: nvidia-smi --gpu-reset, a host reboot),
    # run in the controller's namespace; the validation Job, where set, must succeed before the
    # quarantine lifts.
    reset_job: RepairJobConfig | None = None
    reboot_job: RepairJobConfig | None = None
    validation_job: RepairJobConfig | None = None
    validate_deadline_seconds: Float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _jobs_for_steps(self) -> RepairConfig:
        for step in ("reset", "reboot"):
            if step in self.steps and getattr(self, f"{step}_job") is None:
                raise ValueError(f"{step}_job: required while steps has {step} (a pod template)")
        return self

    @field_validator("steps")
    @classmethod
    def _once_each(cls, v: list[RepairStep]) -> list[RepairStep]:
        if len(set(v)) != len(v):
            raise ValueError("each step at most once")
        return v

"""Scenario files: timed faults, and the processes and MIG instances a simulated node starts with.

A scenario file lists timed faults and, optionally, which processes run on which GPU and which
GPUs run MIG instances::

    faults:
      - {at: 5, gpu: 1, fault: xid, code: 79}
      - {at: 10, gpu: 2, fault: overheat, celsius: 98}
      - {at: 30, gpu: 2, fault: clear}
    processes:
      - {gpu: 0, pid: 4242, name: python, used_memory_mib: 20480, sm_share: 0.6}
      - {gpu: 3, pid: 4343, used_memory_mib: 8192, sm_share: 0.2, gpu_instance: 2}
    mig:
      - {gpu: 3, profiles: [3g.40gb, 3g.40gb]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpumon.config.files import ConfigError, format_validation_error, read_yaml_mapping
from gpumon.config.numbers import Float, Int
from gpumon.devices.simulated.boards import MiB
from gpumon.devices.simulated.faults import FaultSpec
from gpumon.devices.simulated.load import SimProcess


class TimedFault(BaseModel):
    """A scenario entry: a fault and when it happens, written flat (``{at: 5, gpu: 1, fault: lost}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: Float = Field(ge=0, description="seconds after the backend opened")
    spec: FaultSpec

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spec" not in data:
            rest = {k: v for k, v in data.items() if k != "at"}
            return {"at": data["at"], "spec": rest} if "at" in data else {"spec": rest}
        return data


class ScenarioProcess(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)
    pid: Int = Field(gt=0)
    name: str = "python"
    used_memory_mib: Int = Field(ge=0)
    sm_share: Float = Field(ge=0, le=1)
    # The MIG GPU instance it runs in (its compute instance is 0), on a GPU listed under `mig`.
    gpu_instance: Int | None = Field(default=None, ge=0)


class ScenarioMig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Int = Field(ge=0)
    profiles: tuple[str, ...] = Field(min_length=1)


class FaultScenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    faults: tuple[TimedFault, ...] = ()
    processes: tuple[ScenarioProcess, ...] = ()
    mig: tuple[ScenarioMig, ...] = ()

    def stated_processes(self) -> dict[int, tuple[SimProcess, ...]]:
        out: dict[int, list[SimProcess]] = {}
        for p in self.processes:
            out.setdefault(p.gpu, []).append(
                SimProcess(p.pid, p.used_memory_mib * MiB, p.sm_share, p.name, p.gpu_instance)
            )
        return {gpu: tuple(procs) for gpu, procs in out.items()}


def load_scenario(path: Path) -> FaultScenario:
    """Read and validate a scenario file; :class:`ConfigError` naming the bad entry otherwise."""
    data = read_yaml_mapping(path, "scenario file", field="simulation.scenario")
    try:
        return FaultScenario.model_validate(data)
    except ValidationError as e:
        entries = format_validation_error(e).removeprefix("invalid configuration:\n")
        raise ConfigError(
            f"invalid configuration:\n  simulation.scenario: {path} is not a valid scenario:\n{entries}"
        ) from None

"""The demo's scenario file: the fleet, the workload, the controller's demo timings and the
steps to play, each with what it does and the cluster state it waits for. Validated here, at
the edge; a bad file is one readable message naming the field (exit code 2).

The embedded default is ``default.yaml`` beside this module; ``--scenario FILE`` replaces it.
"""

from __future__ import annotations

import enum
import importlib.resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpumon.config import ConfigError, format_validation_error
from gpumon.config.files import parse_yaml, read_yaml_mapping
from gpumon.devices.simulated import SimulationError, parse_fault

DEFAULT_NAME = "default.yaml"


class _ScenarioModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetSpec(_ScenarioModel):
    pool_nodes: int = Field(3, ge=1, le=20)
    max_extra_nodes: int = Field(3, ge=1, le=20)
    gpus_per_node: int = Field(4, ge=1, le=8)
    gpu_model: Literal["A100-SXM4-80GB", "H100-80GB-HBM3", "L40S", "T4"] = "A100-SXM4-80GB"
    shared_node: bool = True
    windows_node: bool = True


class Workload(_ScenarioModel):
    replicas: int = Field(6, ge=1, le=200)
    gpus_per_pod: int = Field(1, ge=1, le=8)
    max_unavailable: int = Field(1, ge=1)


class ControllerTiming(_ScenarioModel):
    recover_after_seconds: float = Field(20.0, ge=0, le=3600)
    xid_window_seconds: float = Field(20.0, gt=0, le=3600)
    scale_down_unneeded_seconds: float = Field(10.0, ge=0, le=3600)


class Expect(enum.StrEnum):
    STEADY = "steady"
    QUARANTINED = "quarantined"
    SCALED_UP = "scaled-up"
    RECOVERED = "recovered"
    REPAIRED = "repaired"
    SCALED_DOWN = "scaled-down"
    REPLACED = "replaced"


class Inject(_ScenarioModel):
    """A fault as the simulated exporter takes it (docs/exporter.md), on ``node`` and ``gpu``;
    either left out means: a pool node's GPU that holds a workload pod."""

    model_config = ConfigDict(extra="allow", frozen=True)

    fault: str
    node: str | None = None
    gpu: int | None = Field(None, ge=0)
    # The GPU an earlier step's repair brought back: it faults again within the flap window.
    again: bool = False

    def body(self, gpu: int) -> dict[str, Any]:
        """The POST /api/v1/faults body for this fault on ``gpu``."""
        extra = dict(self.model_extra or {})
        return {"fault": self.fault, **({} if self.fault == "unavailable" else {"gpu": gpu}), **extra}

    @model_validator(mode="after")
    def _a_known_fault(self) -> Inject:
        if self.again and (self.node is not None or self.gpu is not None):
            raise ValueError("again: the GPU an earlier repair brought back; give no node or gpu with it")
        if self.fault in ("clear", "unavailable"):
            raise ValueError(f"fault {self.fault!r} is not for inject (use `clear: true` to reset GPUs)")
        try:
            parse_fault(self.body(self.gpu or 0))
        except SimulationError as e:
            raise ValueError(" ".join(str(e).removeprefix("invalid fault:").split())) from None
        return self


class ScenarioStep(_ScenarioModel):
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=40)
    say: str = ""
    inject: Inject | None = None
    clear: bool = False  # reset every GPU an earlier step broke
    # The driver asks for a GPU reset of every GPU an earlier step broke, and gpumon's repair
    # ladder carries it out (the pool repairs; docs/demo.md, "The repair").
    repair: bool = False
    scale: int | None = Field(None, ge=0, le=200)  # the workload's replicas
    expect: Expect
    hold_seconds: float = Field(0.0, ge=0, le=600)  # keep showing the state once reached
    timeout_seconds: float | None = Field(None, gt=0, le=3600)  # default: --step-timeout

    @model_validator(mode="after")
    def _one_action(self) -> ScenarioStep:
        actions = [
            a
            for a, on in (
                ("inject", self.inject),
                ("clear", self.clear),
                ("repair", self.repair),
                ("scale", self.scale is not None),
            )
            if on
        ]
        if len(actions) > 1:
            raise ValueError(f"a step does one thing; this one has {', '.join(actions)}")
        return self


class Scenario(_ScenarioModel):
    fleet: FleetSpec = Field(default_factory=FleetSpec)
    workload: Workload = Field(default_factory=Workload)
    controller: ControllerTiming = Field(default_factory=ControllerTiming)
    steps: list[ScenarioStep] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        f, w = self.fleet, self.workload
        if w.gpus_per_pod > f.gpus_per_node:
            raise ValueError(
                f"workload.gpus_per_pod ({w.gpus_per_pod}) exceeds fleet.gpus_per_node "
                f"({f.gpus_per_node}): no node could run a pod"
            )
        names = [s.name for s in self.steps]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"step names must be unique: {', '.join(dup)}")
        broken = repairing = repaired = False
        for i, s in enumerate(self.steps):
            broken |= s.inject is not None
            repairing |= s.repair
            needs = "clear" if s.clear else "repair" if s.repair else s.expect.value
            if (
                needs in ("clear", "repair", Expect.QUARANTINED, Expect.RECOVERED, Expect.REPAIRED)
                and not broken
            ):
                raise ValueError(
                    f"steps.{i} ({s.name}): {needs} needs an earlier step (or this one) to inject a fault"
                )
            if s.expect is Expect.REPAIRED and not repairing:
                raise ValueError(f"steps.{i} ({s.name}): repaired needs a repair step (this one or earlier)")
            if s.inject is not None and s.inject.again and not repaired:
                raise ValueError(
                    f"steps.{i} ({s.name}): inject.again needs an earlier step that expects repaired"
                )
            if s.expect is Expect.REPLACED and s.inject is None:
                raise ValueError(f"steps.{i} ({s.name}): replaced needs this step to inject a fault")
            repaired |= s.expect is Expect.REPAIRED
        return self

    @property
    def repairs(self) -> bool:
        """A step asks for gpumon's repair: the pool's repair ladder is on."""
        return any(s.repair for s in self.steps) or self.replaces

    @property
    def replaces(self) -> bool:
        """A step expects a machine replaced: the ladder's last rung is on."""
        return any(s.expect is Expect.REPLACED for s in self.steps)

    def with_pool_nodes(self, n: int) -> Scenario:
        return self.model_copy(update={"fleet": self.fleet.model_copy(update={"pool_nodes": n})})


def parse(doc: Any, source: str) -> Scenario:
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        detail = format_validation_error(e).removeprefix("invalid configuration:\n")
        raise ConfigError(f"invalid scenario {source}:\n{detail}") from None


def load(path: Path | None) -> Scenario:
    """The scenario in ``path``, or the embedded default; :class:`ConfigError` when invalid."""
    if path is None:
        text = importlib.resources.files(__package__).joinpath(DEFAULT_NAME).read_text()
        return parse(parse_yaml(text, f"scenario (embedded {DEFAULT_NAME})"), f"(embedded {DEFAULT_NAME})")
    return parse(read_yaml_mapping(path, "scenario file"), str(path))

"""A tiny generated fleet (bench/fleet_model.py) and the verdicts the controller's policy gives
its readings: the unit and the prometheus tiers' tests of ``python -m bench fleet-65k``."""

from __future__ import annotations

from bench.fleet_model import Fleet
from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.policy import EMPTY_NODE_STATE, evaluate_node
from gpumon.controller.core.signals import NodeReading
from gpumon.gpu.health import Severity

TINY = Fleet(nodes=12, fault_share=0.2, seed=3)


def verdicts(
    fleet_readings: dict[str, NodeReading], now: float
) -> dict[str, tuple[Severity | None, tuple[str, ...]]]:
    policy = build_policy(ControllerConfig())
    out = {}
    for name, reading in fleet_readings.items():
        v = evaluate_node(name, {}, reading, EMPTY_NODE_STATE, now, policy).verdict
        out[name] = (v.severity, tuple(g.uuid for g in v.gpus))
    return out

"""Simulated GPUs: realistic specs, deterministic time-varying load, processes, faults at run time.

A test double for NVML, and the GPUs of the demo and the benches. ``boards`` are the GPU models
it can play, ``noise`` the deterministic draws every measurement comes from, ``load`` the
processes and the load they put on a GPU, ``faults`` what can go wrong, ``scenario`` a file of
timed faults, and ``backend`` the :class:`~gpumon.devices.backend.DeviceBackend` that plays them.
What the rest of gpumon uses is named here.
"""

from gpumon.devices.simulated.backend import SimulatedBackend
from gpumon.devices.simulated.boards import MODELS, GpuModelSpec, SimulationError, model_spec
from gpumon.devices.simulated.faults import FAULT_KINDS, FaultSpec, FaultStatus, LostFault, parse_fault
from gpumon.devices.simulated.load import SimProcess
from gpumon.devices.simulated.scenario import FaultScenario, ScenarioMig, load_scenario

__all__ = [
    "FAULT_KINDS",
    "MODELS",
    "FaultScenario",
    "FaultSpec",
    "FaultStatus",
    "GpuModelSpec",
    "LostFault",
    "ScenarioMig",
    "SimProcess",
    "SimulatedBackend",
    "SimulationError",
    "load_scenario",
    "model_spec",
    "parse_fault",
]

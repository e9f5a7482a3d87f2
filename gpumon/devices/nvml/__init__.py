"""The NVML device backend, on NVIDIA's nvidia-ml-py binding (``import pynvml``).

The functional core: ``convert`` (what NVML's values and structs are in gpumon's model) and
``errors`` (what an NVML return code means). The imperative shell around it: ``backend``
(:class:`NvmlBackend`: open, enumerate, read a GPU's fields), with ``reads`` (one field's call
and its failure), ``gpu`` (what is held per GPU between reads), ``processes`` (processes and MIG
devices), ``gpm`` (GPM over the interval between two slow ticks) and ``xid`` (the event set of
the Xid thread). docs/nvml.md lists what is read with which call.
"""

from gpumon.devices.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]

"""``python -m bench.device_check.nvml_view``: what NVML itself says, read through gpumon's
backend in a process of its own (NVML is one library per process): driver and CUDA versions,
each GPU's identity and its running processes with their memory, as one JSON line."""

from __future__ import annotations

import dataclasses
import json
import sys

from gpumon.devices.nvml import NvmlBackend


def main() -> int:
    backend = NvmlBackend()
    driver = backend.open()
    try:
        gpus = [
            dataclasses.asdict(ident)
            | {
                "processes": [
                    {"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
                    for p in backend.read_fast(ident.index).processes
                ]
            }
            for ident in backend.devices()
        ]
    finally:
        backend.close()
    print(json.dumps({"driver": dataclasses.asdict(driver), "gpus": gpus}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

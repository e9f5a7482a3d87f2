"""The load generator of step 4, run as a script by the machine's own Python (torch or cupy are
the machine's, not the bundle's): ``python loop.py``.

It takes the GPU (a CUDA context and two 8192² bf16/fp16 matrices) and prints
``ready <pid> <library>``, then obeys one line at a time on stdin: ``load SECONDS`` multiplies
the matrices for that long (tensor cores) and prints ``done <matmuls>``; end of input exits.
``--stand-in``: no GPU work at all, for NVIDIA's mock library, which lists whatever pid its
profile names (the check writes this process's pid there).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

N = 8192


def _torch() -> Callable[[float], int]:
    import torch

    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def run(seconds: float) -> int:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                torch.matmul(a, b)
            torch.cuda.synchronize()
            n += 20
        return n

    return run


def _cupy() -> Callable[[float], int]:
    import cupy

    a = cupy.random.random((N, N), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.random((N, N), dtype=cupy.float32).astype(cupy.float16)
    cupy.cuda.Device().synchronize()

    def run(seconds: float) -> int:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                cupy.matmul(a, b)
            cupy.cuda.Device().synchronize()
            n += 20
        return n

    return run


def _gpu() -> tuple[str, Callable[[float], int] | None]:
    for name, make in (("torch", _torch), ("cupy", _cupy)):
        try:
            return name, make()
        except ImportError:
            continue
    return "none", None


def main(argv: list[str]) -> int:
    name, run = ("stand-in", None) if argv == ["--stand-in"] else _gpu()
    if name == "none":
        print("none neither torch nor cupy imports", flush=True)
        return 3
    print(f"ready {os.getpid()} {name}", flush=True)
    for line in sys.stdin:
        word, _, arg = line.partition(" ")
        if word == "load" and run is not None:
            print(f"done {run(float(arg))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Deterministic noise: a 64-bit mix of (seed, stream, integers) -> [0, 1).

Every simulated measurement is drawn from here, so the same (seed, GPU, time) gives the same
numbers on every run and every Python version.
"""

from __future__ import annotations

import math


def _mix(x: int) -> int:
    # splitmix64 finaliser: cheap, stateless, and stable across Python versions (unlike hash()).
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def bits(*parts: int) -> int:
    h = 0
    for p in parts:
        h = _mix(h ^ (p & 0xFFFFFFFFFFFFFFFF))
    return h


def unit(*parts: int) -> float:
    return (bits(*parts) >> 11) / float(1 << 53)


def smooth_noise(seed: int, stream: int, t: float, step: float) -> float:
    """Value noise in [0, 1): random at multiples of ``step``, cosine-interpolated between."""
    k = math.floor(t / step)
    frac = t / step - k
    a, b = unit(seed, stream, k), unit(seed, stream, k + 1)
    w = (1 - math.cos(math.pi * frac)) / 2
    return a + (b - a) * w


# Streams keep the random draws of different quantities independent.
S_IDENTITY, S_JOB, S_PROC, S_UTIL, S_TEMP, S_COUNTERS, S_STORM = range(1, 8)

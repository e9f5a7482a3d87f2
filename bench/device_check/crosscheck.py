"""Step 3: field by field, every value both nvidia-smi and gpumon report, within what sampling
at different instants allows. gpumon is scraped once before nvidia-smi runs and once after its
next fast tick, and nvidia-smi's value must lie within the tolerance of the range the two
scrapes span: a value that moved between them is not a disagreement."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bench.device_check.scrape import GPU_SERIES

MiB = 2**20


@dataclass(frozen=True)
class Tolerance:
    absolute: float = 0.0
    relative: float = 0.0

    def of(self, value: float) -> float:
        return max(self.absolute, self.relative * abs(value))


EXACT = Tolerance()
# nvidia-smi prints MiB, W with two decimals, whole degrees and percent; beyond the rounding,
# memory moves by allocations between the reads, power and clocks with the load of the instant.
TOLERANCES: Mapping[str, Tolerance] = {
    "memory_total_bytes": Tolerance(absolute=1 * MiB),
    "memory_used_bytes": Tolerance(absolute=32 * MiB),
    "memory_free_bytes": Tolerance(absolute=32 * MiB),
    "memory_reserved_bytes": Tolerance(absolute=1 * MiB),
    "utilization_ratio": Tolerance(absolute=0.10),
    "memory_utilization_ratio": Tolerance(absolute=0.10),
    "encoder_utilization_ratio": Tolerance(absolute=0.10),
    "decoder_utilization_ratio": Tolerance(absolute=0.10),
    "temperature_gpu_celsius": Tolerance(absolute=3),
    "temperature_memory_celsius": Tolerance(absolute=3),
    "power_watts": Tolerance(absolute=15, relative=0.10),
    "power_limit_watts": Tolerance(absolute=1),
    "sm_clock_hertz": Tolerance(relative=0.10),
    "memory_clock_hertz": Tolerance(relative=0.02),
}


@dataclass(frozen=True)
class Row:
    field: str
    smi: float | None
    before: float | None
    after: float | None
    tolerance: float
    ok: bool
    why: str


def compare(
    smi: Mapping[str, float | str | None], before: Mapping[str, float], after: Mapping[str, float]
) -> list[Row]:
    """One row per numeric field either side reports. A field nvidia-smi reports and gpumon does
    not is a failure; one gpumon reports and nvidia-smi does not is listed, not judged."""
    rows = []
    for field, theirs in smi.items():
        if isinstance(theirs, str) or field not in GPU_SERIES:
            continue
        ours = [v for v in (before.get(field), after.get(field)) if v is not None]
        tol = TOLERANCES.get(field, EXACT)
        if theirs is None:
            rows.append(
                Row(field, None, before.get(field), after.get(field), 0, True, "not reported by nvidia-smi")
            )
            continue
        if not ours:
            rows.append(Row(field, theirs, None, None, 0, False, "nvidia-smi reports it, gpumon does not"))
            continue
        slack = tol.of(theirs)
        ok = min(ours) - slack <= theirs <= max(ours) + slack
        rows.append(
            Row(
                field,
                theirs,
                before.get(field),
                after.get(field),
                slack,
                ok,
                "" if ok else "outside tolerance",
            )
        )
    return rows

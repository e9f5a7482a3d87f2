"""Drive :class:`NvmlBackend` through one scenario in this process and print what it saw.

NVML is one library per process and the mock reads ``MOCK_NVML_CONFIG`` once, so every
scenario of tests/nvml/test_mock_nvml.py runs this script in a child process:

    python mock_probe.py SCENARIO [--library PATH]

It prints one JSON document on its last stdout line: the backend's own values (dataclasses as
dicts), the errors it reported, and for the failure scenarios which calls raised what.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from gpumon.devices.backend import BackendError
from gpumon.devices.nvml import NvmlBackend
from gpumon.exporter.gpu_state import GpuState, to_sample, with_xids
from gpumon.gpu.health import HealthPolicy, judge
from gpumon.gpu.model import XidEvent


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def attempt(call: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": ...}`` or ``{"error": "GpuLostError", "index": ...}``."""
    try:
        return {"value": plain(call())}
    except BackendError as err:
        return {"error": type(err).__name__, "index": getattr(err, "index", None), "message": str(err)}


def inventory(backend: NvmlBackend) -> dict[str, Any]:
    driver = backend.open()
    gpus = backend.devices()
    out: dict[str, Any] = {
        "driver": plain(driver),
        "devices": plain(gpus),
        "fast": [plain(backend.read_fast(g.index)) for g in gpus],
        "slow": [plain(backend.read_slow(g.index)) for g in gpus],
        "xids": plain(backend.wait_xids(0.5)),
    }
    backend.close()
    out["reopened_driver"] = plain(backend.open())
    out["reopened_devices"] = plain(backend.devices())
    out["reopened_fast"] = [plain(backend.read_fast(g.index)) for g in backend.devices()]
    backend.close()
    return out


def lost(backend: NvmlBackend) -> dict[str, Any]:
    backend.open()
    gpus = backend.devices()
    return {
        "devices": plain(gpus),
        "fast": [attempt(lambda g=g: backend.read_fast(g.index)) for g in gpus],
        "slow": [attempt(lambda g=g: backend.read_slow(g.index)) for g in gpus],
        "fast_again": [attempt(lambda g=g: backend.read_fast(g.index)) for g in gpus],
        "xids": attempt(lambda: backend.wait_xids(0.5)),
    }


def ecc_xid(backend: NvmlBackend) -> dict[str, Any]:
    backend.open()
    gpus = backend.devices()
    # The first guarded call trips the injected failure; the Xid is delivered after that.
    fast = [backend.read_fast(g.index) for g in gpus]
    slow = [backend.read_slow(g.index) for g in gpus]
    started = time.time()
    first = backend.wait_xids(10.0)
    finished = time.time()
    second = backend.wait_xids(0.5)
    verdicts = [
        judge(
            fast=f,
            slow=s,
            recent_xids=[x for x in first if x.index == g.index],
            lost=False,
            now=finished,
            policy=HealthPolicy(),
        )
        for g, f, s in zip(gpus, fast, slow, strict=True)
    ]
    backend.close()
    return {
        "devices": plain(gpus),
        "fast": plain(fast),
        "slow": plain(slow),
        "first_wait": plain(first),
        "second_wait": plain(second),
        "wait_started": started,
        "wait_finished": finished,
        "verdicts": [{"state": v.state.value, "reasons": [r.code for r in v.reasons]} for v in verdicts],
    }


def reinit(backend: NvmlBackend) -> dict[str, Any]:
    """A fault, then NVML closed and initialised again, as the sampler does when NVML goes away."""
    out: dict[str, Any] = {}
    for run in ("before", "after"):
        backend.open()
        gpus = backend.devices()
        out[run] = {
            "devices": plain(gpus),
            "fast": [attempt(lambda g=g: backend.read_fast(g.index)) for g in gpus],
            "slow": [attempt(lambda g=g: backend.read_slow(g.index)) for g in gpus],
            "xids": attempt(lambda: backend.wait_xids(10.0)),
        }
        backend.close()
    return out


def xid_burst(backend: NvmlBackend) -> dict[str, Any]:
    """An Xid on every GPU at once, over ``REINITS`` initialisations: what one wait hands over
    (the backend drains what is queued after the first event), folded as the exporter folds it
    (with_xids per GPU, then the verdict). The mock delivers each GPU's Xid once per nvmlInit,
    so re-initialising is the only way to make it send more."""
    waits: list[dict[str, Any]] = []
    states: dict[str, GpuState] = {}
    for _ in range(REINITS):
        backend.open()
        gpus = backend.devices()
        for g in gpus:
            states.setdefault(g.uuid, GpuState(g))
            backend.read_fast(g.index)  # the first guarded call trips the injected failure
        started = time.monotonic()
        events = backend.wait_xids(10.0)
        took = time.monotonic() - started
        quiet_started = time.monotonic()
        after = backend.wait_xids(0.2)
        waits.append(
            {
                "events": plain(events),
                "seconds": took,
                "after": plain(after),
                "after_seconds": time.monotonic() - quiet_started,
            }
        )
        by_uuid: dict[str, list[XidEvent]] = {}
        for ev in events:
            by_uuid.setdefault(ev.uuid, []).append(ev)
        for uuid, evs in by_uuid.items():
            states[uuid] = with_xids(states[uuid], evs)
        backend.close()
    now = time.time()
    samples = [to_sample(s, now=now, policy=HealthPolicy()) for s in states.values()]
    return {
        "waits": waits,
        "counts": {s.identity.uuid: {str(k): v for k, v in s.xid_counts.items()} for s in samples},
        "reasons": {s.identity.uuid: [[r.code, r.detail] for r in s.health.reasons] for s in samples},
    }


def slow_ticks(backend: NvmlBackend) -> dict[str, Any]:
    """``SLOW_TICKS`` slow reads of every GPU, as the sampler's slow ticks make them (GPM has an
    interval from the second on); what each tick read."""
    backend.open()
    gpus = backend.devices()
    ticks = [[plain(backend.read_slow(g.index)) for g in gpus] for _ in range(SLOW_TICKS)]
    backend.close()
    return {"devices": plain(gpus), "ticks": ticks}


def recovery_action(backend: NvmlBackend, then: dict[str, Any]) -> dict[str, Any]:
    """Each GPU's recovery action as read with the slow fields and alone; then the overrides
    file (``MOCK_NVML_OVERRIDES``) replaced by ``then``, and each GPU it names read alone until
    its action is the one ``then`` sets (at most ``CHANGE_DEADLINE`` seconds)."""
    backend.open()
    gpus = backend.devices()
    before = {
        "slow": [plain(backend.read_slow(g.index).recovery_action) for g in gpus],
        "alone": [plain(backend.read_recovery_action(g.index)) for g in gpus],
    }
    path = Path(os.environ["MOCK_NVML_OVERRIDES"])
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(then))
    staged.replace(path)
    started = time.monotonic()
    after: dict[str, Any] = {}
    for index, device in then["devices"].items():
        want = device["recovery_action"].upper()
        got = None
        while time.monotonic() - started < CHANGE_DEADLINE:
            action = backend.read_recovery_action(int(index))
            got = None if action is None else action.name
            if got == want:
                break
            time.sleep(0.02)
        after[index] = {"action": got, "seconds": time.monotonic() - started}
    backend.close()
    return {"devices": plain(gpus), "before": before, "after": after}


REINITS = 3
SLOW_TICKS = 3
CHANGE_DEADLINE = 10.0
SCENARIOS = {
    "inventory": inventory,
    "lost": lost,
    "ecc_xid": ecc_xid,
    "reinit": reinit,
    "xid_burst": xid_burst,
    "slow_ticks": slow_ticks,
    "recovery_action": recovery_action,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--library", type=Path)
    parser.add_argument(
        "--mig-sample-from-gpu",
        action="store_true",
        help="answer nvmlGpmMigSampleGet, which the mock stubs, with the whole GPU's nvmlGpmSampleGet",
    )
    parser.add_argument("--then", type=json.loads, help="recovery_action: the overrides document to write")
    args = parser.parse_args()
    if args.mig_sample_from_gpu:
        pynvml.nvmlGpmMigSampleGet = lambda device, _gpu_instance, sample: pynvml.nvmlGpmSampleGet(
            device, sample
        )
    errors: list[tuple[str, str]] = []
    backend = NvmlBackend(
        library_path=args.library, errors=lambda source, kind: errors.append((source, kind))
    )
    scenario = SCENARIOS[args.scenario]
    result = scenario(backend, args.then) if args.scenario == "recovery_action" else scenario(backend)
    # A field a GPU lacks is no error: reported apart, with how often (once per field and GPU).
    result["errors"] = sorted({e for e in errors if e[1] != "not_supported"})
    result["not_supported"] = dict(
        collections.Counter(source for source, kind in errors if kind == "not_supported")
    )
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

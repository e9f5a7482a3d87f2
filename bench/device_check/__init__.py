"""``python -m bench device-check``: gpumon on a real NVIDIA driver in one call, at most eight
minutes, never changing the GPU's settings (docs/nvml.md, "The device check"). ``--mock`` runs
the same steps on NVIDIA's mock library and says which of them the mock cannot do.

Run it through ``hack/device-check.sh``, which installs a bundle from ``make device-bundle`` first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import gpumon
from bench.device_check import report
from bench.device_check.run import STEPS, Options, check

# Short windows on the mock: its readings are constants, only the steps' paths are under test.
MOCK_FOOTPRINT_SECONDS = 5.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench device-check", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="report directory (new or empty)")
    parser.add_argument("--mock", action="store_true", help="NVIDIA's mock libnvidia-ml, no load generator")
    parser.add_argument("--peer", type=Path, help="nvidia_gpu_exporter binary for step 5 (the bundle's)")
    parser.add_argument(
        "--bundle-manifest", type=Path, help="the bundle's MANIFEST.json, quoted in the report"
    )
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle samples before the load")
    parser.add_argument("--load-seconds", type=float, default=60.0, help="seconds of matrix products")
    parser.add_argument(
        "--footprint-seconds", type=float, help="footprint window (default 60, 5 with --mock)"
    )
    args = parser.parse_args(argv)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        parser.error(f"--out {args.out} is not a new or empty directory")
    if args.peer is not None and not args.peer.is_file():
        parser.error(f"--peer {args.peer}: no such file")
    # Kept apart and packed into report.tar.gz: a lent machine sends back at most 8 files.
    work = Path(tempfile.mkdtemp(prefix="gpumon-device-check-")) / "report"
    work.mkdir()
    args.out.mkdir(parents=True, exist_ok=True)
    opts = Options(
        mock=args.mock,
        work=work,
        # The servers run in the work directory: a path relative to here would not name it there.
        peer=None if args.peer is None else args.peer.resolve(),
        idle_seconds=args.idle_seconds,
        load_seconds=args.load_seconds,
        footprint_seconds=args.footprint_seconds or (MOCK_FOOTPRINT_SECONDS if args.mock else 60.0),
    )
    steps = [report.Step(key, title) for key, title in STEPS]
    for s in steps:
        s.error = "not reached"
    # Where gpumon was imported from tells a bundle's install from this checkout's.
    facts = {
        "Python": platform.python_version(),
        "gpumon": f"{version('gpumon')} from {Path(gpumon.__file__).parent}",
    }
    if args.bundle_manifest is not None:
        facts["bundle"] = json.loads(args.bundle_manifest.read_text()).get("summary", "")
    started = time.monotonic()
    try:
        facts |= asyncio.run(check(opts, steps))
    except KeyboardInterrupt:  # hack/device-check.sh's deadline: keep what the steps found
        facts["interrupted"] = "past the check's deadline"
    doc = report.summary("mock" if args.mock else "device", time.monotonic() - started, steps, facts)
    report.write(args.out, work, doc)
    shutil.rmtree(work.parent)
    print(report.markdown(doc))
    return 0 if doc["passed"] else 1

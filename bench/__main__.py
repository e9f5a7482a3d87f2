"""``python -m bench [--quick] [--output FILE]``: run every benchmark, write bench/RESULTS.md.

``python -m bench controller-scale [...]`` runs the controller at 2,000 nodes instead (about
ten minutes; see bench/controller_scale.py) and writes its own section of the same file.
``python -m bench autoscalers``: gpumon + Cluster API beside Karpenter on the same pending GPU
pods (bench/autoscalers.py), its own section too.
``python -m bench fleet-65k``: the pure parts and the Prometheus query round at 65,000 nodes
(bench/fleet_65k.py), its own section.
``python -m bench stream-costs``: the direct source's streams alone, at two heartbeat periods
(bench/stream_costs.py), its own section.
``python -m bench device-check`` and ``device-bundle``: gpumon on a real GPU (docs/nvml.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from bench.report import carry_sections, results_markdown
from bench.run import FULL, QUICK, run

RESULTS = Path(__file__).with_name("RESULTS.md")

INTRO = """\
The gpumon exporter (`gpumon exporter` on 8 simulated GPUs with 64 pods, 1 s sampling) beside
the naive design it replaces (a prometheus_client custom collector that reads the devices on
every scrape, served by prometheus_client's stock threaded HTTP server), measured in one run on
one machine. Targets: docs/benchmarks.md, "Targets". **ratio** is how many times better
gpumon is than the naive design on that figure (above 1: better). Regenerate with `make bench`
(`.venv/bin/python -m bench`); `--quick` is a short run that prints its tables instead."""

NOTES = (
    "The machine has 2 cores and is shared with other engineers' builds and tests (see the load "
    "average above), so absolute figures move from run to run; the two servers are measured in "
    "the same run, taking turns, and the ratios are the figures to read. How much of the servers' "
    "core other processes took during each run is printed beside it: CPU 0's busy time from "
    "/proc/stat (steal included) minus the servers' own CPU time. Tail latencies follow that share "
    "closely; the no-op floor under the open loop shows how much of a p99 is the machine's.",
    "Pods: `bench/pods.py` is a bench fixture implementing the sampler's `PodAttributor`: 64 "
    "containers sharing the 8 GPUs, each with used memory, SM share and a memory and core "
    "allocation, recomputed on every tick. The real attributor (`gpumon/exporter/attribution.py`) "
    "needs a kubelet pod-resources socket, a host /proc and the API server; its tick-time work is "
    "dict lookups like the fixture's, and its /proc and gRPC reads on the slow cadence are not "
    "measured here.",
    "The exporter runs as `python -m bench.exporter_server`: `gpumon exporter`'s own flags, "
    "configuration, backend, sampler and app (`make_app`) with the fixture attributor, served by "
    "aiohttp's `run_app` (access log off, as in the command). The naive server, "
    "`bench/naive_server.py`, yields the same metric families from the same simulated GPUs "
    "(`snapshot_families`), reading fast and slow fields on every scrape; "
    "`prometheus_client.start_http_server` answers HTTP/1.0, one request per connection, one thread "
    "per request, and gzips per request.",
    "Open-loop latencies come from a minimal asyncio HTTP client (`bench/httpclient.py`) timed "
    "from the send to the last body byte, so they include the client's own Python (part of the "
    "no-op floor); percentiles interpolate between the closest ranks. Closed-loop figures are wrk's "
    "(`bench/wrk_report.lua` prints its HdrHistogram percentiles).",
    "The exporter renders once per tick on its event loop (about 3.5 ms of CPU for this payload, "
    "timed in-process; 7 ms for the whole tick): a scrape that arrives during the render waits for "
    "it. That is about 0.4 % of scrapes at any rate, too few to move a p99 by itself, but it leaves "
    "little room: on this shared machine, outside load decides which side of 2 ms a run lands on.",
    "CPU time has the kernel's 10 ms tick resolution; the simulated device reads subtracted from "
    "it are timed in this process on the other core, which assumes the two cores are alike.",
    "All load goes to 127.0.0.1 and every phase is bounded in time; wrk needs the Debian package "
    "`wrk` (installed by `hack/system-packages.sh`).",
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["controller-scale"]:
        from bench import controller_scale

        return controller_scale.main(argv[1:])
    if argv[:1] == ["memory"]:
        from bench import memory

        return memory.main(argv[1:])
    if argv[:1] == ["device-check"]:
        from bench import device_check

        return device_check.main(argv[1:])
    if argv[:1] == ["device-bundle"]:
        from bench.device_check import bundle

        return bundle.main(argv[1:])
    if argv[:1] == ["autoscalers"]:
        from bench import autoscalers

        return autoscalers.main(argv[1:])
    if argv[:1] == ["fleet-65k"]:
        from bench import fleet_65k

        return fleet_65k.main(argv[1:])
    if argv[:1] == ["stream-costs"]:
        from bench import stream_costs

        return stream_costs.main(argv[1:])
    if argv[:1] == ["footprint"]:
        from bench import footprint

        return footprint.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="short windows (about a minute); print, do not write"
    )
    parser.add_argument(
        "--output", type=Path, help=f"where to write the results (default: {RESULTS}, full runs)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="gpumon-bench-") as tmp:
        outcome = asyncio.run(run(plan, Path(tmp)))
    text = results_markdown(intro=INTRO, machine=outcome.machine, tables=outcome.tables, notes=NOTES)
    output = args.output or (None if args.quick else RESULTS)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(carry_sections(output.read_text() if output.exists() else "", text))
        print(f"bench: wrote {output} in {outcome.seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

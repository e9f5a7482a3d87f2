"""Steps 1-6 of the device check, in order, each bounded in time. A step that fails or cannot
run is recorded and the next one runs: one call on a lent GPU must bring back everything it can.

One process generates the load and holds the GPU from the start (:mod:`bench.device_check.loop`,
a stand-in on the mock); NVML's pid for it is made a pod's container on this node by the bench's
pod services (:func:`bench.mock_node.serve_pods`: a host /proc tree, the kubelet's pod-resources
on a unix socket and the API's list and watch), so ``gpumon exporter`` attributes it as on a
Kubernetes node, without a kubelet and without root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import peer
from bench.device_check import crosscheck, families, scrape, smi
from bench.device_check.report import Step
from bench.footprint import PEER, gpumon_argv, one_per_second, series_count
from bench.footprint import scrape as fetch
from bench.httpclient import PROMETHEUS_HEADERS
from bench.mock_node import NAMESPACE, NODE, pod_name, serve_pods
from bench.procs import Server, free_port
from gpumon.devcluster.binaries import locate_mock_nvml

REPO = Path(__file__).resolve().parents[2]
LOOP = Path(__file__).with_name("loop.py")
MiB = 2**20
# The loop's matrices: 2·N³ floating-point operations per product.
N = 8192


@dataclass(frozen=True)
class Options:
    mock: bool
    work: Path
    peer: Path | None
    idle_seconds: float
    load_seconds: float
    footprint_seconds: float


@dataclass
class Found:
    """The loop's process as NVML lists it."""

    gpu: int
    uuid: str
    pid: int
    used_memory_bytes: int | None
    note: str = ""


@dataclass
class State:
    env: dict[str, str]
    loop_pid: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    smi_xml: str = ""
    found: Found | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)


STEPS = (
    ("record", "1. nvidia-smi and the versions"),
    ("families", "2. every family present or not supported"),
    ("crosscheck", "3. gpumon against nvidia-smi, field by field"),
    ("load", "4. utilization, SM and tensor activity under load"),
    ("attribution", "4. the loop's process, its memory, SM share and pod"),
    ("footprint", "5. footprint beside nvidia_gpu_exporter"),
    ("doctor", "6. gpumon doctor"),
)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "MOCK_NVML_"))}


async def guarded(step: Step, body: Coroutine[Any, Any, None]) -> None:
    step.error = "did not finish (interrupted, or past the check's deadline)"
    started = time.monotonic()
    try:
        await body
        step.error = ""
    except Exception as e:
        step.error = f"{type(e).__name__}: {e}"
    finally:
        # Where a lent machine's minutes go, for the next plan of them.
        step.seconds = round(step.seconds + time.monotonic() - started, 1)


async def check(opts: Options, steps: list[Step]) -> dict[str, Any]:
    by = {s.key: s for s in steps}
    state = State(base_env())
    async with contextlib.AsyncExitStack() as stack:
        loop = await stack.enter_async_context(_loop(opts, state, by))
        if opts.mock:
            state.env |= _mock_env(opts, state.loop_pid)
        await guarded(by["record"], record(opts, state, by["record"]))
        if loop is not None:
            await guarded(by["attribution"], find_loop(state, loop.pid, by["attribution"]))
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpumon-device-pods-")))
        placements = [] if state.found is None else [(state.found.pid, state.found.uuid)]
        services = stack.enter_context(serve_pods(root, placements))
        state.env |= services.env()
        exporter = stack.enter_context(_exporter(opts, state))
        ready = by["families"]
        await guarded(ready, families_step(opts, state, exporter, ready))
        if ready.error:
            for s in steps[2:5]:
                s.error = f"not run: the exporter was not ready ({ready.error})"
        else:
            await guarded(by["crosscheck"], crosscheck_step(opts, state, exporter, by["crosscheck"]))
            await guarded(by["load"], load_step(opts, state, exporter, loop, by["load"]))
            await guarded(by["attribution"], attribution_step(state, exporter, by["attribution"]))
        exporter.stop()
        await guarded(by["footprint"], footprint_step(opts, state, by["footprint"]))
        await guarded(by["doctor"], doctor_step(opts, state, by["doctor"]))
    return state.facts


# -- the loop ----------------------------------------------------------------------------------


class Loop:
    def __init__(self, proc: asyncio.subprocess.Process, pid: int, library: str) -> None:
        self.proc = proc
        self.pid = pid
        self.library = library

    async def load(self, seconds: float) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"load {seconds}\n".encode())
        await self.proc.stdin.drain()
        async with asyncio.timeout(seconds + 60):
            words = (await self.proc.stdout.readline()).decode().split()
        if words[:1] != ["done"]:
            raise RuntimeError(f"the load loop stopped: {words}")
        return int(words[1])


@contextlib.asynccontextmanager
async def _loop(opts: Options, state: State, by: Mapping[str, Step]) -> AsyncIterator[Loop | None]:
    """The load loop, started first: the GPU's process list holds it before the exporter opens."""
    log = (opts.work / "loop.log").open("wb")
    # The machine's own Python packages (torch, cupy), not the bundle's.
    env = {k: v for k, v in base_env().items() if k != "PYTHONPATH"}
    argv = [sys.executable, str(LOOP), *(["--stand-in"] if opts.mock else [])]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        try:
            async with asyncio.timeout(180):  # torch's import and CUDA's start, on a cold machine
                words = (await proc.stdout.readline()).decode().split()
        except TimeoutError:
            words = ["late", "not ready within 180 s"]
        if words[:1] == ["ready"]:
            state.loop_pid = int(words[1])
            state.facts["load generator"] = words[2]
            yield Loop(proc, int(words[1]), words[2])
        else:
            why = " ".join(words[1:]) or f"it exited ({(opts.work / 'loop.log').read_text()[-300:]})"
            for key in ("load", "attribution"):
                by[key].skip("the load loop", why)
            yield None
    finally:
        proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()
        log.close()


# -- 1. record ---------------------------------------------------------------------------------


async def nvml_view(env: Mapping[str, str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.device_check.nvml_view",
        env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"NVML could not be read: {err.decode()[-500:]}")
    view: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    return view


async def record(opts: Options, state: State, step: Step) -> None:
    if opts.mock:
        step.skip("nvidia-smi -q -x", "nvidia-smi reads the driver, and the mock is a library without one")
    elif not smi.available():
        step.skip("nvidia-smi -q -x", "no nvidia-smi on this machine's PATH")
    else:
        state.smi_xml = smi.save_query(opts.work / "nvidia-smi-q.xml")
        (opts.work / "nvidia-smi-version.txt").write_text(smi.run(smi.VERSION))
        theirs = smi.versions(state.smi_xml)
        step.figures["nvidia-smi versions"] = theirs
    view = await nvml_view(state.env)
    (opts.work / "nvml-view.json").write_text(json.dumps(view, indent=1))
    driver = view["driver"]
    state.facts |= {
        "driver": driver["driver_version"],
        "CUDA": driver["cuda_version"],
        "GPUs": ", ".join(f"{g['index']}: {g['model']}" for g in view["gpus"]),
    }
    step.figures["NVML"] = driver
    step.check(
        "NVML answers", bool(view["gpus"]), f"{len(view['gpus'])} GPU(s), driver {driver['driver_version']}"
    )
    if state.smi_xml:
        theirs = step.figures["nvidia-smi versions"]
        same = (theirs["driver_version"], theirs["cuda_version"]) == (
            driver["driver_version"],
            driver["cuda_version"],
        )
        step.check("nvidia-smi and NVML name the same driver and CUDA versions", same, json.dumps(theirs))


def _mock_env(opts: Options, pid: int | None) -> dict[str, str]:
    """NVIDIA's mock library with its H100 profile cut to one GPU, as the lent machine has one,
    whose process list names the stand-in loop's pid."""
    mock = locate_mock_nvml()
    profile: dict[str, Any] = yaml.safe_load(mock.profile("h100").read_text())
    profile["devices"] = [d for d in profile["devices"] if d["index"] == 0]
    if pid is not None:
        gpu = profile["devices"][0]
        # Per-pod SM shares are scaled to the card's own measured use (docs/pod-attribution.md).
        gpu["utilization"] = {**profile["device_defaults"]["utilization"], "gpu": 35}
        gpu["processes"] = [
            {
                "pid": pid,
                "type": "C",
                "name": "python3",
                "used_memory_mib": 2048,
                "sm_util": 35,
                "mem_util": 10,
            }
        ]
    path = opts.work / "mock-profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return {"LD_LIBRARY_PATH": str(mock.lib_dir), "MOCK_NVML_CONFIG": str(path)}


async def find_loop(state: State, pid: int, step: Step) -> None:
    """NVML's entry for the loop. Inside a container NVML still lists the host's pid: then the
    one process on the GPU is taken as the loop's, and the report says so."""
    deadline = time.monotonic() + 60
    while True:
        view = await nvml_view(state.env)
        listed = [(g, p) for g in view["gpus"] for p in g["processes"]]
        mine = [(g, p) for g, p in listed if p["pid"] == pid]
        note = ""
        if not mine and len(listed) == 1:
            mine, note = (
                listed,
                f"NVML lists pid {listed[0][1]['pid']} for the loop's {pid}: another pid namespace",
            )
        if mine:
            g, p = mine[0]
            state.found = Found(g["index"], g["uuid"], p["pid"], p["used_memory_bytes"], note)
            break
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    found = state.found
    detail = (
        "not listed within 60 s"
        if found is None
        else f"pid {found.pid}, {_mib(found.used_memory_bytes)} on GPU {found.gpu}"
    )
    step.check(
        "NVML lists the loop's process with its memory",
        found is not None and bool(found.used_memory_bytes),
        detail,
    )
    if found is not None and found.note:
        step.figures["pid namespace"] = found.note


# -- the exporter ------------------------------------------------------------------------------


@contextlib.contextmanager
def _exporter(opts: Options, state: State) -> Any:
    port = free_port()
    argv = gpumon_argv(port, "--metrics-profile", "both", "--slow-interval", "2")
    server = Server(
        "gpumon", argv, port=port, cpus=(), log=opts.work / "exporter.log", cwd=opts.work,
        noop_path="/healthz", env=state.env,
    )  # fmt: skip
    with server:
        yield server


async def until(
    server: Server, what: str, ready: Callable[[scrape.Series], bool], seconds: float = 60
) -> tuple[str, scrape.Series]:
    """The first scrape for which ``ready`` holds; a RuntimeError with the server's log after
    ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            text = (await fetch(server)).decode()
            series = scrape.parse(text)
            if ready(series):
                return text, series
        if time.monotonic() > end:
            raise RuntimeError(f"{server.name}: {what} not within {seconds:g} s:\n{server.tail()}")
        await asyncio.sleep(0.5)


def _ticks(series: scrape.Series, cadence: str) -> float:
    return scrape.value(series, "gpumon_exporter_sample_duration_seconds_count", cadence=cadence) or 0


def _pod(series: scrape.Series, name: str) -> float | None:
    return scrape.value(series, name, namespace=NAMESPACE, pod=pod_name(0))


# -- 2. families -------------------------------------------------------------------------------


async def families_step(opts: Options, state: State, exporter: Server, step: Step) -> None:
    await exporter.wait_ready("/metrics", 60)

    def settled(series: scrape.Series) -> bool:
        # Three slow ticks: GPM has an interval; the loop's process has been resolved to its pod.
        attributed = state.found is None or _pod(series, "gpumon_pod_gpu_memory_used_bytes") is not None
        return _ticks(series, "slow") >= 3 and attributed

    text, series = await until(exporter, "three slow ticks and the loop's pod", settled, 60)
    (opts.work / "scrape-settled.txt").write_text(text)
    found = families.classify(
        scrape.families(text), scrape.not_supported(series), pod=state.found is not None
    )
    by_state: dict[str, dict[str, str]] = {}
    for name, (where, why) in found.items():
        by_state.setdefault(where, {})[name] = why
    step.figures |= {
        "present": sorted(by_state.get("present", {})),
        "not_supported": by_state.get("not_supported", {}),
        "not_applicable": by_state.get("not_applicable", {}),
        "missing": sorted(by_state.get("missing", {})),
        "NVML sources not supported": sorted(scrape.not_supported(series)),
    }
    missing = by_state.get("missing", {})
    counts = {k: len(by_state.get(k, {})) for k in ("present", "not_supported", "not_applicable")}
    step.check(
        f"each of {len(found)} families present ({counts['present']}), not supported by NVML "
        f"({counts['not_supported']}) or not applicable ({counts['not_applicable']})",
        not missing,
        f"missing: {', '.join(sorted(missing))}" if missing else "",
    )
    errors = {
        dict(k)["source"] + "/" + dict(k)["kind"]: v
        for k, v in scrape.select(series, "gpumon_exporter_errors_total").items()
    }
    other = {k: v for k, v in errors.items() if not k.endswith("/not_supported") and v > 0}
    step.check("no read failed other than not_supported", not other, json.dumps(other) if other else "")


# -- 3. cross-check ----------------------------------------------------------------------------


async def crosscheck_step(opts: Options, state: State, exporter: Server, step: Step) -> None:
    if opts.mock or not state.smi_xml:
        why = "the mock has no nvidia-smi" if opts.mock else "no nvidia-smi on this machine's PATH"
        step.skip("every field both nvidia-smi and gpumon report", why)
        return
    before_text, before = await until(exporter, "a scrape", lambda s: True)
    xml = smi.save_query(opts.work / "nvidia-smi-crosscheck.xml")
    done = time.time()

    def fresh(series: scrape.Series) -> bool:
        last = scrape.value(series, "gpumon_exporter_last_sample_timestamp_seconds", cadence="fast")
        return last is not None and last > done

    after_text, after = await until(exporter, "a fast tick after nvidia-smi", fresh, 30)
    (opts.work / "scrape-crosscheck-before.txt").write_text(before_text)
    (opts.work / "scrape-crosscheck-after.txt").write_text(after_text)
    ours = scrape.gpus(before)
    rows = []
    for bus, theirs in smi.readings(xml).items():
        info = ours.get(bus)
        if not step.check(f"nvidia-smi's GPU {bus} is exported", info is not None):
            continue
        assert info is not None
        gpu = info["gpu"]
        step.check(f"GPU {gpu} UUID", theirs["uuid"] == info["uuid"], f"{theirs['uuid']} / {info['uuid']}")
        step.check(
            f"GPU {gpu} model", theirs["model"] == info["model"], f"{theirs['model']} / {info['model']}"
        )
        for r in crosscheck.compare(theirs, scrape.gpu_values(before, gpu), scrape.gpu_values(after, gpu)):
            rows.append({"gpu": gpu, **r.__dict__})
            if r.smi is None:
                step.skip(f"GPU {gpu} {r.field}", r.why)
            else:
                step.check(
                    f"GPU {gpu} {r.field}",
                    r.ok,
                    f"nvidia-smi {r.smi:g}, gpumon {r.before}..{r.after} ±{r.tolerance:g} {r.why}".strip(),
                )
    versions = smi.versions(xml)
    for key, label in (("driver_version", "driver version"), ("cuda_version", "CUDA version")):
        labels = {i[key] for i in ours.values()}
        step.check(
            f"gpumon_gpu_info {label}",
            labels == {versions[key]},
            f"nvidia-smi {versions[key]}, gpumon {sorted(labels)}",
        )
    step.figures["fields"] = rows


# -- 4. load and attribution -------------------------------------------------------------------

_UNDER_LOAD = (
    ("utilization", "gpumon_gpu_utilization_ratio", {}, 0.3),
    ("SM active (GPM)", "gpumon_gpu_sm_active_ratio", {}, 0.2),
    ("tensor active (GPM)", "gpumon_gpu_pipe_active_ratio", {"pipe": "tensor"}, 0.05),
)
FALL_SECONDS = 30.0


def _sample(state: State, series: scrape.Series, phase: str, started: float) -> dict[str, Any]:
    assert state.found is not None
    gpu = str(state.found.gpu)
    row: dict[str, Any] = {"t": round(time.monotonic() - started, 1), "phase": phase}
    for what, name, labels, _ in _UNDER_LOAD:
        row[what] = scrape.value(series, name, gpu=gpu, **labels)
    row["pod memory"] = _pod(series, "gpumon_pod_gpu_memory_used_bytes")
    row["pod SM share"] = _pod(series, "gpumon_pod_gpu_utilization_ratio")
    state.samples.append(row)
    return row


async def load_step(opts: Options, state: State, exporter: Server, loop: Loop | None, step: Step) -> None:
    if opts.mock:
        step.skip(
            "utilization, SM-active and tensor-active under load",
            "the mock has no load generator: its utilization and GPM values are the profile's constants",
        )
        return
    if loop is None or state.found is None:
        if loop is not None:
            step.skip("utilization under load", "NVML did not list the loop's process")
        return
    started = time.monotonic()

    async def sample(phase: str) -> dict[str, Any]:
        _, series = await until(exporter, "a scrape", lambda s: True)
        return _sample(state, series, phase, started)

    while time.monotonic() - started < opts.idle_seconds:
        await sample("idle")
        await asyncio.sleep(1)
    work = asyncio.create_task(loop.load(opts.load_seconds))
    while not work.done():
        await sample("load")
        await asyncio.wait({work}, timeout=1)
    matmuls = work.result()
    load_end = time.monotonic()
    idle = {what: _peak(state.samples, "idle", what) for what, *_ in _UNDER_LOAD}

    def fallen(row: dict[str, Any]) -> bool:
        return all(row[w] is not None and row[w] <= (idle[w] or 0) + 0.1 for w, *_ in _UNDER_LOAD)

    # Polled once a second: the exporter's own sampling is the event, and it has no push.
    while not fallen(await sample("after")) and time.monotonic() - load_end < FALL_SECONDS:  # noqa: ASYNC110
        await asyncio.sleep(1)
    (opts.work / "timeline.json").write_text(json.dumps(state.samples, indent=1))
    after = state.samples[-1]
    for what, _, _, rise in _UNDER_LOAD:
        peak = _peak(state.samples, "load", what)
        base = idle[what]
        ok = peak is not None and base is not None and peak >= base + rise
        step.check(f"{what} rises under load", ok, f"idle {base}, peak {peak}; at least +{rise}")
    step.check(
        f"all three fall back within {FALL_SECONDS:g} s of the load's end",
        fallen(after),
        f"{after['t'] - (load_end - started):.1f} s after: "
        + ", ".join(f"{w} {after[w]}" for w, *_ in _UNDER_LOAD),
    )
    step.figures |= {
        "library": loop.library,
        "matmuls": matmuls,
        "TFLOPS": round(2 * N**3 * matmuls / opts.load_seconds / 1e12, 1),
        "idle peak": idle,
        "load peak": {w: _peak(state.samples, "load", w) for w, *_ in _UNDER_LOAD},
    }


def _peak(rows: list[dict[str, Any]], phase: str, what: str) -> float | None:
    values = [r[what] for r in rows if r["phase"] == phase and r[what] is not None]
    return max(values) if values else None


async def attribution_step(state: State, exporter: Server, step: Step) -> None:
    found = state.found
    if found is None:
        return
    _, series = await until(exporter, "a scrape", lambda s: True)
    _sample(state, series, "end", time.monotonic())
    pod = f"{NAMESPACE}/{pod_name(0)}"
    memory = [r["pod memory"] for r in state.samples if r["pod memory"] is not None]
    share = [r["pod SM share"] for r in state.samples if r["pod SM share"] is not None]
    step.check(
        f"gpumon attributes the process's memory to pod {pod}",
        bool(memory) and max(memory) > 0,
        f"gpumon up to {_mib(max(memory, default=None))}, NVML {_mib(found.used_memory_bytes)}",
    )
    step.check(
        f"gpumon gives pod {pod} an SM share",
        bool(share) and max(share) > 0,
        f"up to {max(share, default=None)}",
    )
    allocated = _pod(series, "gpumon_pod_gpu_allocated")
    step.check(
        f"pod-resources' GPU is allocated to {pod}", allocated == 1, f"gpumon_pod_gpu_allocated {allocated}"
    )


def _mib(value: float | None) -> str:
    return "none" if value is None else f"{value / MiB:,.0f} MiB"


# -- 5. footprint ------------------------------------------------------------------------------


async def footprint_step(opts: Options, state: State, step: Step) -> None:
    """gpumon (its default native profile, 1 s sampling) and, where the bundle carries it,
    nvidia_gpu_exporter (collecting on each scrape), both scraped once a second for the same
    window: bench footprint's CPU and memory figures, on this machine's NVML."""
    gp_port = free_port()
    gp = Server(
        "gpumon", gpumon_argv(gp_port), port=gp_port, cpus=(), log=opts.work / "footprint-gpumon.log",
        cwd=opts.work, noop_path="/healthz", env=state.env,
    )  # fmt: skip
    servers = [gp]
    with contextlib.ExitStack() as stack:
        stack.enter_context(gp)
        if opts.peer is None:
            step.skip(
                f"{PEER} beside gpumon",
                "the bundle carries no nvidia_gpu_exporter (built without GPUMON_PEER_SRC)",
            )
        else:
            port = free_port()
            other = Server(
                PEER, peer.argv(port, opts.peer), port=port, cpus=(), log=opts.work / "footprint-peer.log",
                cwd=opts.work, noop_path="/", env=state.env,
            )  # fmt: skip
            stack.enter_context(other)
            try:
                await other.wait_ready("/metrics", 60)
                servers.append(other)
            except RuntimeError as e:
                step.check(f"{PEER} starts", False, str(e)[-500:])
        await gp.wait_ready("/metrics", 60)
        await until(gp, "the first slow tick", lambda s: _ticks(s, "slow") >= 1, 60)
        before = {s.name: s.cpu_seconds() for s in servers}
        t0 = time.monotonic()
        await asyncio.gather(*(one_per_second(s, opts.footprint_seconds) for s in servers))
        elapsed = time.monotonic() - t0
        for s in servers:
            text = await fetch(s)
            gz = await fetch(s, PROMETHEUS_HEADERS)
            rss, peak = s.memory()
            step.figures[s.name] = {
                "CPU %": round(100 * (s.cpu_seconds() - before[s.name]) / elapsed, 2),
                "RSS MiB": round(rss / MiB, 1),
                "peak RSS MiB": round(peak / MiB, 1),
                "threads": len(os.listdir(f"/proc/{s.pid}/task")),
                "series": series_count(text),
                "bytes, text": len(text),
                "bytes, as Prometheus asks": len(gz),
            }
            step.check(f"{s.name} answered a scrape a second for {elapsed:.0f} s", True)
            (opts.work / f"footprint-{s.name}.txt").write_bytes(text)
    step.figures["window seconds"] = round(elapsed, 1)


# -- 6. doctor ---------------------------------------------------------------------------------


async def doctor_step(opts: Options, state: State, step: Step) -> None:
    argv = [sys.executable, "-m", "gpumon.cli", "doctor", "--output", "json", "--timeout", "10"]
    proc = await asyncio.create_subprocess_exec(
        *argv, env=state.env | {"NODE_NAME": NODE}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    (opts.work / "doctor.json").write_bytes(out)
    (opts.work / "doctor.log").write_bytes(err)
    doc = json.loads(out)
    step.figures = {f"{c['family']}: {c['name']}": c["status"] for c in doc["checks"]}
    failing = [c["name"] for c in doc["checks"] if c["family"] == "nvml" and c["status"] == "fail"]
    step.check("no NVML check of gpumon doctor fails", not failing, ", ".join(failing))

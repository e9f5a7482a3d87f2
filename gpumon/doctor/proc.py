"""The host's /proc as the exporter reads it: readable, the host's PID namespace (hostPID),
the cgroup version and driver of GPU processes, and cgroup lines that do not parse.

The cgroup of each process is parsed by the exporter's own parser
(:func:`gpumon.exporter.cgroups.parse_cgroup`), so what doctor calls unparseable is exactly
what attribution skips.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpumon.doctor.result import CheckResult, Status
from gpumon.exporter.cgroups import ContainerKey, Unmatched, parse_cgroup

FAMILY = "proc"
SAMPLE_LIMIT = 4096  # newest processes read when NVML names no GPU process to start from
_SHOWN = 5
HOST_PROC_FIX = (
    "mount the host's /proc read-only (hostPath /proc at /host/proc) and pass --host-proc /host/proc"
)
HOST_PID_FIX = (
    "run the exporter pod with hostPID: true (the chart does when pod attribution is on), or mount "
    "the host's /proc at --host-proc"
)


@dataclass(frozen=True, slots=True)
class CgroupFile:
    pid: int
    text: str


@dataclass(frozen=True, slots=True)
class ProcFacts:
    host_proc: str
    error: str | None = None  # why host_proc cannot be listed
    processes: int = 0
    init_cgroup: str | None = None  # PID 1's cgroup file; None when unreadable
    samples: tuple[CgroupFile, ...] = ()
    # NVML's GPU processes, when NVML answered: the sample is taken from them.
    gpu_pids: tuple[int, ...] | None = None
    missing_gpu_pids: tuple[int, ...] = ()  # listed by NVML, absent under host_proc


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def gather(host_proc: Path, gpu_pids: tuple[int, ...] | None, *, limit: int = SAMPLE_LIMIT) -> ProcFacts:
    root = os.fspath(host_proc)
    try:
        pids = sorted(int(n) for n in os.listdir(root) if n.isdigit())
    except OSError as e:
        return ProcFacts(root, error=e.strerror or str(e), gpu_pids=gpu_pids)
    present = set(pids)
    if gpu_pids is not None:
        chosen = [p for p in gpu_pids if p in present][:limit]
        missing = tuple(p for p in gpu_pids if p not in present)
    else:
        chosen, missing = pids[-limit:], ()
    samples = []
    for pid in chosen:
        text = _read(f"{root}/{pid}/cgroup")
        if text is not None:  # exited meanwhile
            samples.append(CgroupFile(pid, text))
    return ProcFacts(
        root,
        processes=len(pids),
        init_cgroup=_read(f"{root}/1/cgroup"),
        samples=tuple(samples),
        gpu_pids=gpu_pids,
        missing_gpu_pids=missing,
    )


# ---------------------------------------------------------------------------------------------
# Judgement (pure)


def cgroup_version(text: str) -> str:
    """``v2`` (one unified line), ``v1 (hybrid)`` (v1 hierarchies plus the unified one) or ``v1``."""
    lines = [line for line in text.splitlines() if line.strip()]
    unified = [line for line in lines if line.startswith("0::")]
    if lines and len(unified) == len(lines):
        return "v2"
    return "v1 (hybrid)" if unified else "v1"


def cgroup_driver(text: str) -> str | None:
    """The kubelet's cgroup driver, from the first line that names the kubepods hierarchy."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" in path:
            return "systemd" if ".slice" in path else "cgroupfs"
    return None


def judge(facts: ProcFacts) -> list[CheckResult]:
    if facts.error is not None:
        found = f"cannot list {facts.host_proc}: {facts.error}"
        return [CheckResult(FAMILY, "host /proc", Status.FAIL, found, HOST_PROC_FIX)]
    parsed = [(f, parse_cgroup(f.text)) for f in facts.samples]
    return [
        CheckResult(FAMILY, "host /proc", Status.OK, f"{facts.host_proc}: {facts.processes} processes"),
        _host_pid(facts),
        _layout(facts, [f for f, key in parsed if isinstance(key, ContainerKey)]),
        _unparsed(
            [f for f, key in parsed if isinstance(key, Unmatched) and key.is_error],
        ),
    ]


def _host_pid(facts: ProcFacts) -> CheckResult:
    if facts.missing_gpu_pids:
        total = len(facts.gpu_pids or ())
        found = (
            f"{len(facts.missing_gpu_pids)} of {total} GPU process(es) NVML lists are not under "
            f"{facts.host_proc} (e.g. PID {facts.missing_gpu_pids[0]}): another PID namespace"
        )
        return CheckResult(FAMILY, "hostPID", Status.WARN, found, HOST_PID_FIX)
    if facts.init_cgroup is None:
        found = f"cannot read {facts.host_proc}/1/cgroup"
        return CheckResult(FAMILY, "hostPID", Status.WARN, found, HOST_PROC_FIX)
    init = parse_cgroup(facts.init_cgroup)
    if isinstance(init, ContainerKey):
        found = (
            f"PID 1 under {facts.host_proc} runs in pod {init.pod_uid}: this is a container's PID "
            "namespace, other pods' processes are not visible"
        )
        return CheckResult(FAMILY, "hostPID", Status.WARN, found, HOST_PID_FIX)
    found = "PID 1 is the host's init: other pods' processes are visible"
    if facts.gpu_pids:
        found += f"; all {len(facts.gpu_pids)} GPU process(es) found"
    return CheckResult(FAMILY, "hostPID", Status.OK, found)


def _layout(facts: ProcFacts, in_pods: list[CgroupFile]) -> CheckResult:
    source = "GPU process(es)" if facts.gpu_pids is not None else "process(es)"
    if not in_pods:
        if facts.gpu_pids is not None:
            found = f"none of {len(facts.samples)} GPU process(es) runs in a pod: nothing to attribute"
            return CheckResult(FAMILY, "cgroup layout", Status.OK, found)
        found = f"no process under {facts.host_proc} runs in a pod's cgroup"
        return CheckResult(FAMILY, "cgroup layout", Status.WARN, found, HOST_PROC_FIX)
    versions = Counter(cgroup_version(f.text) for f in in_pods)
    drivers = Counter(cgroup_driver(f.text) or "unknown" for f in in_pods)
    found = f"cgroup {', '.join(versions)}, {', '.join(drivers)} driver (from {len(in_pods)} pod {source})"
    if len(versions) > 1 or len(drivers) > 1:
        return CheckResult(
            FAMILY,
            "cgroup layout",
            Status.WARN,
            "mixed: " + found,
            "one node should have one layout: check the kubelet's cgroupDriver against the runtime's",
        )
    return CheckResult(FAMILY, "cgroup layout", Status.OK, found)


def _unparsed(bad: list[CgroupFile]) -> CheckResult:
    if not bad:
        return CheckResult(FAMILY, "cgroup lines", Status.OK, "every pod cgroup line parses")
    details = tuple(f"PID {f.pid}: {_kubepods_line(f.text)}" for f in bad[:_SHOWN])
    return CheckResult(
        FAMILY,
        "cgroup lines",
        Status.WARN,
        f"{len(bad)} process(es) look like they run in a pod, but their cgroup does not parse",
        "attribution skips them (pod-resources allocations still count); report these lines to gpumon",
        details,
    )


def _kubepods_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "kubepods" in line), lines[0] if lines else "")

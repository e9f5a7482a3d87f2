"""The peer exporter the footprint bench compares with: utkuozdemir/nvidia_gpu_exporter (Go), built
from source with its NVML backend, for the bench only (no test or README command needs it).

The Go module proxy refuses ``github.com/utkuozdemir/nvidia_gpu_exporter`` but serves its
dependencies, so its source comes from a checkout or a bare git snapshot named by
``GPUMON_PEER_SRC``; the commit in ``bench/peer/COMMIT`` is taken from it, the committed
``bench/peer/go.mod``/``go.sum`` (the project's own at that commit) are laid over it, and it is
built read-only (``-mod=readonly``, ``GOTOOLCHAIN=local``) into the tools cache, keyed by commit.

With ``--collect.backend nvml`` it reads NVML through NVIDIA's go-nvml (cgo, ``dlopen`` of
``libnvidia-ml.so.1``): one call per field per GPU, the fields ``nvmlDeviceGetFieldValues``
serves batched, and by default one collection per scrape (``--collect.interval 0``). It does not
run nvidia-smi in this mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from gpumon.devcluster.binaries import cache_dir

HERE = Path(__file__).with_name("peer")
COMMIT = (HERE / "COMMIT").read_text().strip()
PACKAGE = "./cmd/nvidia_gpu_exporter"


class PeerUnavailable(Exception):
    pass


# The device check carries its build to a machine whose libraries are unknown: Go's own resolver
# and user lookup (netgo, osusergo) leave glibc as its one shared library, which it needs anyway
# to dlopen libnvidia-ml (a static glibc cannot load the driver's library); -s -w drop symbols.
PORTABLE = ("-tags=netgo,osusergo", "-ldflags=-s -w")


def binary(*, portable: bool = False) -> Path:
    name = f"nvidia_gpu_exporter-{COMMIT[:12]}{'-portable' if portable else ''}"
    return cache_dir() / name / "nvidia_gpu_exporter"


def _source(into: Path) -> None:
    src = os.environ.get("GPUMON_PEER_SRC")
    if not src:
        raise PeerUnavailable(
            "set GPUMON_PEER_SRC to a checkout (or bare git snapshot) of "
            "github.com/utkuozdemir/nvidia_gpu_exporter: the Go module proxy refuses that module"
        )
    git_dir = Path(src) / ".git" if (Path(src) / ".git").exists() else Path(src)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", f"--git-dir={git_dir}", "archive", COMMIT], stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(into, filter="data")


def build(*, portable: bool = False) -> Path:
    """The peer's binary, built once per commit (and flavour: :data:`PORTABLE`)."""
    out = binary(portable=portable)
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="gpumon-peer-") as tmp:
        work = Path(tmp)
        _source(work)
        shutil.copy(HERE / "go.mod", work / "go.mod")
        shutil.copy(HERE / "go.sum", work / "go.sum")
        env = os.environ | {
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-mod=readonly -buildvcs=false",
            "CGO_ENABLED": "1",
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["go", "build", "-trimpath", *(PORTABLE if portable else ()), "-o", str(out), PACKAGE],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise PeerUnavailable(f"building nvidia_gpu_exporter failed:\n{done.stderr[-3000:]}")
    return out


def argv(port: int, binary: Path | None = None) -> list[str]:
    """Its NVML backend with per-process metrics (gpumon's side has its pods), collecting on
    every scrape as it does by default; ``binary``: a build brought along (the device check's
    bundle) instead of this machine's."""
    return [
        str(binary or build()),
        "--collect.backend=nvml",
        "--collect.compute-apps",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]

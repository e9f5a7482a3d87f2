"""``python -m bench device-bundle [--out DIR]`` (``make device-bundle``): what the device check
needs on a machine that has a driver and a Python 3.12 but neither gpumon nor its dependencies
and no network: gpumon's wheel and its dependencies' wheels for CPython 3.12 on manylinux x86-64,
each at exactly the version this checkout's environment resolved (``pip freeze``; nothing floats),
plus nvidia_gpu_exporter built here when ``GPUMON_PEER_SRC`` names its source (bench/peer.py).

``hack/device-check.sh --bundle DIR`` installs gpumon from it (``pip install --no-index
--find-links DIR/wheels --target``) and runs the check from there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import requires
from pathlib import Path
from typing import Any

from bench import peer

REPO = Path(__file__).resolve().parents[2]
MiB = 2**20
# What the lent machine runs: CPython 3.12 on glibc x86-64.
PLATFORM = (
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64",
)  # fmt: skip
# The check's whole tree travels in 64 MiB; the repository takes about 5 of them.
BUDGET = 48 * MiB


class BundleError(Exception):
    pass


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def roots() -> list[str]:
    """gpumon's own requirements, less its extras'."""
    return [r for r in requires("gpumon") or [] if "extra ==" not in r]


def pins() -> dict[str, str]:
    """name -> version of every distribution in this environment but gpumon itself."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {_canonical(n): v for n, _, v in (line.partition("==") for line in out.splitlines()) if v}


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BundleError(f"pip {args[0]} failed:\n{done.stderr[-2000:]}")


def _wheel_key(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return _canonical(name), version


def _checkout_copy(into: Path) -> Path:
    """This checkout's files as git sees them (tracked, and new ones not ignored). setuptools
    builds in the source tree's build/ and never deletes what an earlier build left there, so a
    wheel built in place carries modules removed or moved since (a package and its old module
    side by side after a split)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is listed too
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def build(out: Path) -> dict[str, Any]:
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpumon-wheel-") as source:
        _pip("wheel", "--no-deps", "--wheel-dir", str(wheels), str(_checkout_copy(Path(source))))
    pinned = pins()
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("".join(f"{n}=={v}\n" for n, v in sorted(pinned.items())))
        constraints.flush()
        _pip("download", *PLATFORM, "--dest", str(wheels), "--constraint", constraints.name, *roots())
    floating = [
        w.name
        for w in wheels.glob("*.whl")
        if _wheel_key(w)[0] != "gpumon" and _wheel_key(w) not in pinned.items()
    ]
    if floating:
        raise BundleError(f"not at this environment's versions (pip freeze): {', '.join(sorted(floating))}")
    manifest: dict[str, Any] = {
        "python": "cp312 manylinux x86_64",
        "wheels": [
            {"file": w.name, "bytes": w.stat().st_size, "sha256": hashlib.sha256(w.read_bytes()).hexdigest()}
            for w in sorted(wheels.glob("*.whl"))
        ],
        "peer": _peer(out) if os.environ.get("GPUMON_PEER_SRC") else None,
    }
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    if size > BUDGET:
        raise BundleError(f"the bundle is {size / MiB:.1f} MiB, past its {BUDGET / MiB:.0f} MiB budget")
    peer_note = "with nvidia_gpu_exporter" if manifest["peer"] else "without nvidia_gpu_exporter"
    manifest["summary"] = f"{len(manifest['wheels'])} wheels, {peer_note}, {size / MiB:.1f} MiB"
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _peer(out: Path) -> dict[str, Any]:
    """nvidia_gpu_exporter in its portable build: glibc is its one shared library, and the newest
    glibc symbol version it needs says which machines can run it."""
    binary = out / "bin" / "nvidia_gpu_exporter"
    binary.parent.mkdir()
    shutil.copy2(peer.build(portable=True), binary)
    symbols = subprocess.run(
        ["objdump", "-T", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    glibc = max(
        (tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", symbols)), default=()
    )
    return {
        "commit": peer.COMMIT,
        "bytes": binary.stat().st_size,
        "needs glibc": ".".join(map(str, glibc)),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench device-bundle", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / ".device-bundle", help="default: .device-bundle")
    args = parser.parse_args(argv)
    out: Path = args.out
    if out.exists():
        if not (out / "MANIFEST.json").is_file() and any(out.iterdir()):
            parser.error(f"--out {out} holds something other than a device bundle")
        shutil.rmtree(out)
    try:
        manifest = build(out)
    except (BundleError, peer.PeerUnavailable) as e:
        print(f"device-bundle: {e}", file=sys.stderr)
        return 1
    print(f"device-bundle: {out}: {manifest['summary']}")
    return 0

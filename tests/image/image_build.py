"""The image built for this tier: deploy/image/Containerfile by hack/build-image.sh on the base
hack/image-base.sh makes (both cached: a warm run rebuilds only what changed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpumon:test"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    base: str
    base_seconds: float  # making or finding the base, this session
    build_seconds: float  # buildah bud, this session (layers cached from earlier builds)
    labels: dict[str, str]
    config: dict[str, object]
    size_bytes: int


def _run(argv: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        pytest.fail(f"{what} failed (exit {out.returncode}):\n{out.stderr[-4000:]}", pytrace=False)
    return out.stdout


def build() -> BuiltImage:
    missing = [t for t in ("buildah", "podman", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: run `make setup` (hack/system-packages.sh)", pytrace=False
        )
    t0 = time.monotonic()
    base = _run(["bash", str(REPO / "hack" / "image-base.sh")], "hack/image-base.sh", 900).strip()
    t1 = time.monotonic()
    env = os.environ | {"IMAGE": IMAGE, "BASE": base}
    if HOST_CA_BUNDLE.is_file():
        # The registries are reached through a proxy whose CA only the host trusts (docs/images.md).
        env["CA_BUNDLE"] = str(HOST_CA_BUNDLE)
    _run(["bash", str(REPO / "hack" / "build-image.sh")], "hack/build-image.sh", 1200, env)
    t2 = time.monotonic()
    inspected = json.loads(_run(["buildah", "inspect", "--type", "image", IMAGE], "buildah inspect", 60))
    oci = inspected["OCIv1"]
    size = json.loads(_run(["podman", "image", "inspect", IMAGE], "podman image inspect", 60))[0]["Size"]
    return BuiltImage(IMAGE, base, t1 - t0, t2 - t1, oci["config"].get("Labels") or {}, oci["config"], size)

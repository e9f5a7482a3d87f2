"""The Linux image as built from deploy/image/Containerfile: what it says about itself (OCI
labels, `gpumon version`), whom it runs as, and what it must not carry (NVML)."""

from __future__ import annotations

import subprocess

import pytest
from image_build import BuiltImage

from gpumon import __version__

pytestmark = pytest.mark.timeout(1800)  # a cold first build makes the base too (docs/images.md)


def _inside(image: BuiltImage, *command: str) -> str:
    """``command`` run in a fresh container of ``image``, as the image's user."""
    name = subprocess.run(
        ["buildah", "from", image.ref], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    try:
        out = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", name, "--", *command],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_oci_labels_name_the_build(image: BuiltImage) -> None:
    labels = image.labels
    assert labels["org.opencontainers.image.title"] == "gpumon"
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] in (_head(), f"{_head()}-dirty")
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == image.base
    assert "org.opencontainers.image.source" in labels


def test_version_inside_the_image_reports_the_revision(image: BuiltImage) -> None:
    revision = image.labels["org.opencontainers.image.revision"]
    assert _inside(image, "gpumon", "version") == f"gpumon {__version__} (revision {revision})\n"


def test_runs_as_nobody_through_the_gpumon_entrypoint(image: BuiltImage) -> None:
    assert image.config["User"] == "65534:65534"
    assert image.config["Entrypoint"] == ["gpumon"]
    assert _inside(image, "id", "-u") == "65534\n"


def test_no_nvml_library_is_baked_in(image: BuiltImage) -> None:
    """The container toolkit injects the node driver's own libnvidia-ml at run time."""
    found = _inside(
        image,
        "python",
        "-c",
        "import ctypes.util, pathlib; print(ctypes.util.find_library('nvidia-ml'),"
        " sorted(str(p) for d in ('/usr', '/opt', '/lib') for p in pathlib.Path(d).rglob('libnvidia-ml*')))",
    )
    assert found == "None []\n"


def test_the_image_is_slim(image: BuiltImage) -> None:
    """The runtime holds the interpreter and the venv, no compiler, pip or build tools; a
    regression guard well above the measured size (docs/images.md)."""
    assert image.size_bytes < 350e6, f"{image.size_bytes / 1e6:.0f} MB"
    assert _inside(image, "sh", "-c", "ls /opt/gpumon/bin | grep -c '^pip' || true") == "0\n"

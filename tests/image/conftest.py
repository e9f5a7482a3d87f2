"""The image tier: deploy/image/Containerfile built with buildah on a local Debian base, then the
chart's containers run from the image (tests/image/chart_pod.py).

No registry is reachable on this workplace's machines, so the base is made here
(hack/image-base.sh: mmdebstrap, then podman import; cached in the tools cache, keyed by what it
is built from) and the build mounts the host's CA bundle for pip (docs/images.md). buildah,
podman and mmdebstrap are installed by `make setup`: a missing one fails the tier, it never
skips it."""

from __future__ import annotations

import pytest
from image_build import BuiltImage, build

_built: list[BuiltImage] = []


@pytest.fixture(scope="session")
def image() -> BuiltImage:
    built = build()
    _built.append(built)
    return built


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for b in _built:
        terminalreporter.write_line(
            f"image {b.ref}: {b.size_bytes / 1e6:.0f} MB; base {b.base} ready in {b.base_seconds:.0f}s, "
            f"image built in {b.build_seconds:.0f}s"
        )

"""Which build of gpumon this is: the package's version, plus the image's version and git
revision where an image build recorded them.

``deploy/image/Containerfile`` writes ``build.json`` at the package's top in the image (from its
``VERSION`` and ``REVISION`` build arguments); a checkout or a wheel has none, and reports the
package's version alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpumon import __version__

BUILD_FILE = Path(__file__).parents[1] / "build.json"


@dataclass(frozen=True)
class Build:
    version: str  # the package's
    image_version: str = ""
    revision: str = ""

    def describe(self) -> str:
        """``gpumon 0.1.0``, and in an image ``gpumon 0.1.0 (image 0.1.0-rc1, revision 3059d54)``."""
        extra = []
        if self.image_version and self.image_version != self.version:
            extra.append(f"image {self.image_version}")
        if self.revision:
            extra.append(f"revision {self.revision}")
        return f"gpumon {self.version}" + (f" ({', '.join(extra)})" if extra else "")


def current(path: Path | None = None) -> Build:
    """This installation's build (``path``: :data:`BUILD_FILE`). A missing file is a build from
    source; an unreadable one is reported as such rather than failing the command that asks
    (``version``, build_info)."""
    path = path or BUILD_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Build(__version__)
    except (OSError, ValueError) as e:
        return Build(__version__, revision=f"unknown ({path}: {e})")
    if not isinstance(recorded, dict):
        return Build(__version__, revision=f"unknown ({path}: not a JSON object)")
    return Build(__version__, str(recorded.get("version", "")), str(recorded.get("revision", "")))

"""What ``gpumon version`` and gpumon_exporter_build_info report: the package's version, and an
image's version and revision from the build.json its build writes (deploy/image/Containerfile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon import __version__, cli
from gpumon.runtime import build


def test_from_source_the_package_version_alone(tmp_path: Path) -> None:
    assert build.current(tmp_path / "build.json").describe() == f"gpumon {__version__}"


def test_an_image_adds_its_revision(tmp_path: Path) -> None:
    (tmp_path / "build.json").write_text(f'{{"version": "{__version__}", "revision": "3059d54"}}\n')
    assert build.current(tmp_path / "build.json").describe() == f"gpumon {__version__} (revision 3059d54)"


def test_an_image_version_other_than_the_package_is_shown(tmp_path: Path) -> None:
    (tmp_path / "build.json").write_text('{"version": "9.9.9-rc1", "revision": "abc"}')
    assert build.current(tmp_path / "build.json").describe() == (
        f"gpumon {__version__} (image 9.9.9-rc1, revision abc)"
    )


@pytest.mark.parametrize("text", ["{not json", "[1]"])
def test_a_damaged_file_is_reported_not_raised(tmp_path: Path, text: str) -> None:
    (tmp_path / "build.json").write_text(text)
    described = build.current(tmp_path / "build.json").describe()
    assert described.startswith(f"gpumon {__version__} (revision unknown (")


def test_version_command_prints_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "build.json").write_text(f'{{"version": "{__version__}", "revision": "feed"}}')
    monkeypatch.setattr(build, "BUILD_FILE", tmp_path / "build.json")
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out == f"gpumon {__version__} (revision feed)\n"

"""A CPython 3.12, the lent GPU machine's Python, to install the device bundle into. Found the same
way on a developer's machine and in CI: a ``python3.12`` on the PATH that runs (pyenv's shim for
it does not run while another version is pyenv's global one), else pyenv's newest 3.12 under
``$PYENV_ROOT`` (default ``~/.pyenv``), which this project's machines have."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def python312() -> Path:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    pyenv = sorted(
        root.glob("versions/3.12.*/bin/python3.12"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-3].split(".")],
        reverse=True,
    )
    on_path = shutil.which("python3.12")
    for candidate in [*([Path(on_path)] if on_path else []), *pyenv]:
        done = subprocess.run(
            [candidate, "-c", "import sys, venv; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and done.stdout.strip() == "True":
            return candidate
    raise AssertionError(
        f"no Python 3.12 here: none runs as python3.12 on the PATH, none under {root}/versions "
        "(install one: `pyenv install 3.12`)"
    )

"""``helm template`` of the chart into a list of objects: the one renderer of every tier that
reads the chart (cluster: lint, schema, dry-run, RBAC, values; image: the containers it runs)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "gpumon"


def render(
    helm: Path, values: Mapping[str, Any], *, release: str = "r", namespace: str = "gpumon"
) -> list[dict[str, Any]]:
    """Strings go as ``--set`` (helm parses them: "true" is a boolean, "2" a number), anything
    else as ``--set-json``."""
    sets = [
        arg
        for key, value in values.items()
        for arg in (
            ("--set", f"{key}={value}")
            if isinstance(value, str)
            else ("--set-json", f"{key}={json.dumps(value)}")
        )
    ]
    result = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, *sets],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d]

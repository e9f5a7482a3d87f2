"""The controller's public contract is named in one place (gpumon/controller/core/contract/): no
key of gpumon's own, or of Cluster API's, is spelled anywhere else in the controller or in
``gpumon status``, so a reader of the contract, and a new record kind, have one module to look at.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gpumon
from gpumon.config.controller import BreakerConfig
from gpumon.controller.core import contract as c

_PACKAGE = Path(gpumon.__file__).parent
_NAMES = _PACKAGE / "controller" / "core" / "contract" / "__init__.py"
# A label or annotation key (or key prefix) in gpumon's or Cluster API's domain.
_KEY = re.compile(r"^[a-z0-9.-]*(gpumon\.io|x-k8s\.io)/[A-Za-z0-9._-]*$")


def _keys_spelled_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(_PACKAGE.parent)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _KEY.match(node.value)
    ]


def test_no_key_is_spelled_outside_the_contract() -> None:
    sources = [*(_PACKAGE / "controller").rglob("*.py"), *(_PACKAGE / "status").rglob("*.py")]
    assert _NAMES in sources
    elsewhere = [k for path in sources if path != _NAMES for k in _keys_spelled_in(path)]
    assert elsewhere == []


def test_the_contract_names_the_keys_the_scan_looks_for() -> None:
    # The scan above would pass on an empty contract module; these are keys it must recognise.
    assert {c.TAINT_KEY, c.RECORD_ANNOTATION, c.DELETE_MACHINE_ANNOTATION, c.BREAKER_ANNOTATION_PREFIX} <= {
        k.rsplit(": ", 1)[1].strip("'") for k in _keys_spelled_in(_NAMES)
    }


def test_the_configured_pool_label_defaults_to_the_contracts() -> None:
    # The config layer may not import the controller, so it spells the default itself.
    assert BreakerConfig().pool_label == c.LABEL_POOL

"""Garbage in the files a person hands the programs: an exporter or controller config, a rules
file, a scenario file. Each is loaded or refused with a ConfigError (exit 2, one message naming
the field and the file), never another exception."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from strategies import FUZZ, json_values

from gpumon.config import ConfigError, ExporterConfig, load
from gpumon.config.controller import ControllerConfig
from gpumon.config.rules import RuleConfig, read_rules_file
from gpumon.devices.simulated import FaultScenario, load_scenario


def _field_names(model: Any, seen: set[Any] | None = None) -> set[str]:
    """Every field name in a settings model and the sections under it."""
    seen = seen if seen is not None else set()
    if not (isinstance(model, type) and issubclass(model, BaseModel)) or model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for f in model.model_fields.values():
        for arg in (f.annotation, *getattr(f.annotation, "__args__", ())):
            names |= _field_names(arg, seen)
    return names


NAMES = sorted(
    _field_names(ExporterConfig)
    | _field_names(ControllerConfig)
    | _field_names(RuleConfig)
    | _field_names(FaultScenario)
    | {"rules", "faults", "processes", "mig", "at", "fault", "gpu", "code", "signal", "threshold"}
)

config_like: st.SearchStrategy[Any] = st.recursive(
    json_values,
    lambda inner: st.dictionaries(st.sampled_from(NAMES), inner, max_size=5),
    max_leaves=30,
)


def _yaml(value: Any) -> bytes:
    try:
        return yaml.safe_dump(value, allow_unicode=True).encode()
    except (yaml.YAMLError, ValueError, OverflowError):
        return b"{"


file_bodies = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=120).map(str.encode),
    config_like.map(_yaml),
    st.dictionaries(st.sampled_from(NAMES), config_like, max_size=4).map(_yaml),
    # Duplicate keys, anchors, tags, a document stream, invalid UTF-8 inside a valid document.
    st.sampled_from(
        [
            b"port: 1\nport: 2\n",
            b"a: &x [*x]\n",
            b"!!python/object:os.system {}\n",
            b"--- {}\n--- {}\n",
            b"node_name: \xff\xfe\n",
            b"port: true\n",
            b"port: 1e999\n",
            b"rules: [{signal: 1e999}]\n",
            b"faults: [{at: .nan, gpu: 0, fault: xid, code: 79}]\n",
            b"\x00",
        ]
    ),
)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpumon-fuzz-") as d:
        yield Path(d)


LOADERS: dict[str, Callable[[Path], object]] = {
    "exporter": lambda p: load(ExporterConfig, config_file=p),
    "controller": lambda p: load(ControllerConfig, config_file=p),
    "rules": read_rules_file,
    "scenario": load_scenario,
}


@pytest.mark.parametrize("kind", sorted(LOADERS))
@settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 4))  # a settings load costs ~50 ms
@given(body=file_bodies)
def test_a_file_is_loaded_or_refused_with_a_config_error(kind: str, body: bytes, scratch: Path) -> None:
    path = scratch / f"{kind}.yaml"
    path.write_bytes(body)
    try:
        LOADERS[kind](path)
    except ConfigError as e:
        assert str(e), "a refusal says why"

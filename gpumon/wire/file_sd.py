"""Prometheus's file service discovery format, as one file both Prometheus and the controller
read: a list of target groups, each ``{"targets": ["host:port", ...], "labels": {...}}``
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).

Exporters outside the cluster's pods (on machines the operator lists, or in the demo, where
kwok's pods are not processes) are usually already listed for Prometheus in such a file. The
direct signal source reads the same file (``signals.direct.targets_file``) instead of a second,
hand-synced node -> URL map: a group's node label names the node its one target serves.

The file is input from outside the process, so it is bounded and validated whole before it is
used: a file that fails any rule is refused with one message naming the group and the rule, and
the reader keeps the last map it accepted."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

MAX_FILE_BYTES: Final = 8 << 20
MAX_GROUPS: Final = 100_000
# Prometheus's own label, honoured here as there: the scheme a group's targets are reached by.
SCHEME_LABEL: Final = "__scheme__"


class FileSdError(ValueError):
    """The file breaks a rule; the message names the group (by index) and the rule."""


class TargetGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    targets: list[str] = Field(..., max_length=MAX_GROUPS)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)


_GROUPS = TypeAdapter(tuple[TargetGroup, ...])


def parse(raw: bytes, *, yaml_format: bool) -> tuple[TargetGroup, ...]:
    """The target groups of a file's bytes (YAML for ``.yml``/``.yaml`` files, as Prometheus
    decides by the extension, JSON otherwise)."""
    if len(raw) > MAX_FILE_BYTES:
        raise FileSdError(f"{len(raw)} bytes, over the {MAX_FILE_BYTES} allowed")
    try:
        data = yaml.safe_load(raw) if yaml_format else json.loads(raw)
    except (yaml.YAMLError, ValueError) as e:
        raise FileSdError(f"not {'YAML' if yaml_format else 'JSON'}: {' '.join(str(e).split())}") from None
    if data is None:
        return ()
    if isinstance(data, list) and len(data) > MAX_GROUPS:
        raise FileSdError(f"{len(data)} target groups, over the {MAX_GROUPS} allowed")
    try:
        return _GROUPS.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        shape = "a list of {targets: [...], labels: {...}}"
        raise FileSdError(f"{where}: {first['msg']} ({shape})") from None


def exporter_urls(groups: Iterable[TargetGroup], *, node_label: str, scheme: str) -> dict[str, str]:
    """Node name -> exporter base URL. Every group names its node in ``node_label`` and has
    exactly one target (a node has one exporter); a node named twice is refused, as is a target
    that is not ``host:port``."""
    urls: dict[str, str] = {}
    for i, g in enumerate(groups):
        node = g.labels.get(node_label)
        if not node:
            raise FileSdError(f"{i}.labels: no {node_label!r} label naming the node")
        if len(g.targets) != 1:
            raise FileSdError(f"{i}.targets: {len(g.targets)} targets for node {node}; one exporter per node")
        target = g.targets[0]
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in target:
            raise FileSdError(f"{i}.targets.0: {target!r} is not host:port")
        group_scheme = g.labels.get(SCHEME_LABEL, scheme)
        if group_scheme not in ("http", "https"):
            raise FileSdError(f"{i}.labels.{SCHEME_LABEL}: {group_scheme!r}, not http or https")
        if node in urls:
            raise FileSdError(f"{i}.labels.{node_label}: node {node} is in an earlier group too")
        urls[node] = f"{group_scheme}://{target}"
    return urls


def read_exporter_urls(raw: bytes, *, filename: str, node_label: str, scheme: str) -> dict[str, str]:
    """A file's bytes, parsed by its name's extension, as :func:`exporter_urls`."""
    groups = parse(raw, yaml_format=filename.endswith((".yml", ".yaml")))
    return exporter_urls(groups, node_label=node_label, scheme=scheme)


def dump(exporters: Mapping[str, str], *, node_label: str = "node") -> bytes:
    """The file for node name -> ``host:port``: one group per exporter, its node in ``node_label``."""
    groups = [
        TargetGroup(targets=[address], labels={node_label: node}).model_dump(mode="json")
        for node, address in sorted(exporters.items())
    ]
    return json.dumps(groups).encode()

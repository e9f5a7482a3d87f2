"""Configuration models for every knob, and the one way they are loaded. The exporter's models and
the sections both programs share are here; the controller's are in :mod:`gpumon.config.controller`,
so the exporter's process never imports them (docs/exporter.md, "What the exporter imports").

Sources, highest first: command-line flags > environment (``GPUMON_…``, nested with ``__``,
e.g. ``GPUMON_SAMPLING__FAST_INTERVAL_SECONDS``) > YAML file (``--config``), merged key by key.
The environment is read here (:func:`_environment`), as pydantic-settings read it before: that
library cost the exporter's process about 1 MiB and some 30 modules for a few dozen lines
(docs/exporter.md, "What the exporter imports"). Invalid input
raises :class:`ConfigError`, whose message names every bad field (and the file or variable a
bad value came from); the CLI prints it and exits with code 2. Files are read by
:mod:`gpumon.config.files`; numbers are :mod:`gpumon.config.numbers`' ``Int``/``Float``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import is_dataclass
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from gpumon.config.files import ConfigError as ConfigError
from gpumon.config.files import Loc, field_error, read_yaml_mapping
from gpumon.config.files import format_validation_error as format_validation_error
from gpumon.config.numbers import Float, Int
from gpumon.config.section import Section
from gpumon.gpu.health import HealthPolicy
from gpumon.gpu.model import HealthState
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER

DEFAULT_EXPORTER_PORT = 9842
"""Neither nvidia_gpu_exporter's 9835 nor dcgm-exporter's 9400 (docs/configuration.md)."""


class LogConfig(Section):
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


class SamplingConfig(Section):
    fast_interval_seconds: Float = Field(1.0, gt=0, le=3600)
    slow_interval_seconds: Float = Field(10.0, gt=0, le=86400)
    call_timeout_seconds: Float = Field(2.0, gt=0, le=60)

    @model_validator(mode="after")
    def _slow_not_faster(self) -> SamplingConfig:
        if self.slow_interval_seconds < self.fast_interval_seconds:
            raise ValueError("slow_interval_seconds must be >= fast_interval_seconds")
        return self


class HealthConfig(Section):
    """How a GPU is judged (gpumon.gpu.health): the same section in the exporter's config and
    under the controller's ``policy:``, turned into the frozen policy by :meth:`policy` alone."""

    xid_overrides: dict[Int, HealthState] = Field(default_factory=dict)
    unknown_xid_state: HealthState = HealthState.DEGRADED
    xid_window_seconds: Float = Field(600.0, gt=0)
    temperature_degraded_celsius: Float = Field(87.0, gt=0, lt=200)
    temperature_unhealthy_celsius: Float = Field(95.0, gt=0, lt=200)

    @model_validator(mode="after")
    def _ordered(self) -> HealthConfig:
        if self.temperature_unhealthy_celsius < self.temperature_degraded_celsius:
            raise ValueError("temperature_unhealthy_celsius must be >= temperature_degraded_celsius")
        return self

    def policy(self) -> HealthPolicy:
        """The one converter to the frozen value both programs judge with."""
        return HealthPolicy(
            xid_overrides=MappingProxyType(dict(self.xid_overrides)),
            unknown_xid_state=self.unknown_xid_state,
            xid_window_seconds=self.xid_window_seconds,
            temperature_degraded_celsius=self.temperature_degraded_celsius,
            temperature_unhealthy_celsius=self.temperature_unhealthy_celsius,
        )


class SimulationConfig(Section):
    gpus: Int = Field(8, ge=1, le=64)
    model: str = "A100-SXM4-80GB"
    seed: Int = 0
    scenario: Path | None = None


class TlsConfig(Section):
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class KubernetesAuthConfig(Section):
    """``auth.mode: kubernetes``: TokenReview + SubjectAccessReview (docs/security.md)."""

    # Decisions are reused this long (0: ask every time), kube-rbac-proxy style; failures never.
    cache_ttl_seconds: Float = Field(10.0, ge=0, le=3600)
    cache_max_entries: Int = Field(1024, ge=1, le=1_000_000)
    timeout_seconds: Float = Field(5.0, gt=0, le=60)


class AuthConfig(Section):
    # static: the basic credentials and/or bearer token below (none given: no authentication);
    # kubernetes: a bearer token the API server vouches for, allowed by RBAC on the path.
    mode: Literal["static", "kubernetes"] = "static"
    basic_username: str | None = None
    basic_password: SecretStr | None = None
    bearer_token_file: Path | None = None
    kubernetes: KubernetesAuthConfig = KubernetesAuthConfig()

    @model_validator(mode="after")
    def _complete(self) -> AuthConfig:
        if (self.basic_username is None) != (self.basic_password is None):
            raise ValueError("basic_username and basic_password go together")
        if self.mode == "kubernetes" and (
            self.basic_username is not None or self.bearer_token_file is not None
        ):
            raise ValueError("basic_username/basic_password and bearer_token_file are for mode static only")
        return self


class ServerConfig(Section):
    """What the HTTP server allows one client (docs/exporter.md, "Slow clients"): a client that
    sends its headers a byte at a time, or opens connections and sends nothing, must not hold
    the server that Prometheus, the kubelet's probes and the controller need."""

    # From a request's first byte to the end of its headers. A scraper sends them at once.
    header_timeout_seconds: Float = Field(10.0, gt=0, le=3600)
    # A kept-alive connection with no request for this long is closed (as is one that never sends
    # any); a scraper reconnects at no cost.
    idle_timeout_seconds: Float = Field(75.0, gt=0, le=86400)
    # Open connections at most; past it the oldest one not serving a request is closed. Watch
    # streams (one per controller replica) count as serving.
    max_connections: Int = Field(256, ge=1, le=65536)


class PodsConfig(Section):
    """Per-pod attribution (kubelet pod-resources, /proc cgroups, pod annotations)."""

    enabled: bool = True
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    host_proc: Path = Path("/proc")
    resource_names: tuple[str, ...] = ("nvidia.com/gpu",)
    resource_prefixes: tuple[str, ...] = ("nvidia.com/mig-",)
    max_series: Int = Field(4096, ge=1)
    api: bool = True
    # DRA drivers whose devices are GPUs: a container's claim devices of these drivers are
    # resolved to GPUs through this node's ResourceSlices, watched from the first such claim on
    # (docs/pod-attribution.md, "DRA"). Empty turns DRA attribution off; it also needs `api`.
    dra_drivers: tuple[str, ...] = (NVIDIA_GPU_DRIVER,)
    # The gpushare device plugin's --memory-unit: what one aliyun.com/gpu-mem unit means.
    gpushare_memory_unit: Literal["GiB", "MiB"] = "GiB"


def _default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


class Settings(BaseModel):
    """A program's whole configuration, loaded by :func:`load`. Defaults are validated too (a
    default factory reads the environment: ``NODE_NAME``, ``POD_NAMESPACE``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ExporterConfig(Settings):
    node_name: str = Field(default_factory=_default_node_name, min_length=1)
    listen_address: str = "0.0.0.0"
    port: Int = Field(DEFAULT_EXPORTER_PORT, ge=0, le=65535)
    metrics_profile: Literal["native", "dcgm", "both"] = "native"
    backend: Literal["nvml", "simulated"] = "nvml"
    nvml_library: Path | None = None
    sampling: SamplingConfig = SamplingConfig()
    health: HealthConfig = HealthConfig()
    simulation: SimulationConfig = SimulationConfig()
    pods: PodsConfig = PodsConfig()
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()
    server: ServerConfig = ServerConfig()
    log: LogConfig = LogConfig()

    @field_validator("listen_address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError("must be a host name or IP address")
        return v


S = TypeVar("S", bound=Settings)

ENV_PREFIX = "GPUMON_"
ENV_NESTED_DELIMITER = "__"


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType)


def _complex(annotation: Any) -> bool:
    """A section, a list, a tuple or a mapping: set from one variable as JSON."""
    annotation = _unwrap(annotation)
    if _is_union(annotation):
        return any(_complex(a) for a in get_args(annotation))
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type) or issubclass(kind, str | bytes):
        return False
    return issubclass(kind, BaseModel | Mapping | Sequence | AbstractSet) or is_dataclass(kind)


def _field_type(annotation: Any, key: str) -> Any:
    """The type ``key`` names inside ``annotation`` (a section's field, a mapping's values), or
    None when it names nothing there."""
    annotation = _unwrap(annotation)
    if get_origin(annotation) is dict:
        return get_args(annotation)[-1]
    if _is_union(annotation):
        found = (_field_type(member, key) for member in get_args(annotation))
        return next((t for t in found if t is not None), None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, info in annotation.model_fields.items():
            if name.lower() == key:
                return info.annotation
    return None


def _json(text: str, variable: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise field_error(where, f"${variable} is not valid JSON: {e}") from None


def _environment(model: type[Settings], environ: Mapping[str, str]) -> dict[str, Any]:
    """What the ``GPUMON_…`` variables set, as pydantic-settings read them before (names in any
    case): ``GPUMON_<FIELD>`` for each field of ``model``, JSON when the field is complex (a
    section, list, tuple or mapping); ``GPUMON_<FIELD>__<KEY>[__<KEY>…]`` one key inside a
    complex field, JSON when that key's own field is complex, merged over the whole-field
    variable. Other values stay strings, for the model to validate; unknown keys inside a section
    reach the model (and are refused there); variables naming no field are ignored."""
    env = {name.lower(): value for name, value in environ.items()}
    prefix = ENV_PREFIX.lower()
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        whole = prefix + name
        is_complex = _complex(info.annotation)
        value: Any = env.get(whole)
        if value is not None and is_complex:
            value = _json(value, whole.upper(), name)
        if is_complex and (value is None or isinstance(value, dict)):
            parts = _exploded(whole + ENV_NESTED_DELIMITER, name, info.annotation, env)
            value = _merged(value or {}, parts) if parts or value is not None else None
        if value is not None:
            values[name] = value
    return values


def _exploded(prefix: str, field: str, annotation: Any, env: Mapping[str, str]) -> dict[str, Any]:
    # Shallower variables first, so that a deeper one lands inside the section a shallower one
    # set as JSON, whatever the environment's order; and one that would land inside a plain
    # value is refused, not dropped.
    out: dict[str, Any] = {}
    setters: dict[tuple[str, ...], str] = {}  # keys -> the variable that set them
    named = (v for v in env if v.startswith(prefix))
    for variable in sorted(named, key=lambda v: v.count(ENV_NESTED_DELIMITER)):
        *path, last = variable.removeprefix(prefix).split(ENV_NESTED_DELIMITER)
        keys = tuple(path)
        node, target = out, annotation
        for depth, key in enumerate(keys, 1):
            target = _field_type(target, key) if target is not None else None
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                # set by a variable of its own, or inside the JSON of a shallower one
                setter = next(setters[keys[:d]] for d in range(depth, 0, -1) if keys[:d] in setters)
                raise field_error(
                    ".".join((field, *keys[:depth])),
                    f"${variable.upper()} sets a key inside it, but ${setter} sets it to a value "
                    "that is not a section",
                )
            node = child
        target = _field_type(target, last) if target is not None else None
        text = env[variable]
        value: Any = text
        if target is not None and text and _complex(target):
            value = _json(text, variable.upper(), ".".join((field, *keys, last)))
        node[last] = value
        setters[(*keys, last)] = variable.upper()
    return out


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``, mappings merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _holds(data: Any, loc: Loc) -> bool:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return False
    return True


def _origin_finder(
    flags: Mapping[str, Any], config_file: Path | None, file_data: Any
) -> Callable[[Loc], str | None]:
    """Where a bad value came from, by precedence: a flag (said by its field name alone), a
    ``GPUMON_…`` variable, else the config file, so a message can name the file to fix."""
    env = {name.upper() for name in os.environ}

    def origin(loc: Loc) -> str | None:
        if _holds(flags, loc):
            return None
        for i in range(len(loc), 0, -1):
            name = "GPUMON_" + "__".join(str(p) for p in loc[:i]).upper()
            if name in env:
                return f"from ${name}"
        if config_file is not None and _holds(file_data, loc):
            return f"from config file {config_file}"
        return None

    return origin


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"sampling.fast_interval_seconds": 2}`` -> ``{"sampling": {"fast_interval_seconds": 2}}``."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def load(model: type[S], *, flags: Mapping[str, Any] | None = None, config_file: Path | None = None) -> S:
    """Build ``model`` from flags > environment > YAML file, or raise :class:`ConfigError`."""
    file_data = read_yaml_mapping(config_file, "config file") if config_file is not None else {}

    nested = nest(flags or {})
    merged = _merged(_merged(file_data, _environment(model, os.environ)), nested)
    try:
        return model.model_validate(merged)
    except ValidationError as e:
        origin = _origin_finder(nested, config_file, file_data)
        raise ConfigError(format_validation_error(e, origin=origin)) from None


ConfigFlag = tuple[str, str, str, str]
"""A command-line flag that sets a config field: (flag, dotted field, metavar, help)."""


def add_config_arguments(
    parser: argparse.ArgumentParser, flags: Sequence[ConfigFlag], *, config_help: str
) -> None:
    """``--config FILE`` plus one flag per config field. Only flags the user passes reach the
    config (``SUPPRESS``), so the environment and the file fill in the rest; values stay strings
    so the config model validates them and names the field when one is wrong."""
    parser.add_argument("--config", type=Path, metavar="FILE", default=argparse.SUPPRESS, help=config_help)
    for flag, key, metavar, help_text in flags:
        parser.add_argument(flag, dest=key, metavar=metavar, default=argparse.SUPPRESS, help=help_text)


def load_from_args(
    model: type[S], args: argparse.Namespace, flags: Sequence[ConfigFlag], extra_keys: Sequence[str] = ()
) -> S:
    """``model`` from the flags of :func:`add_config_arguments` that were given (plus
    ``extra_keys``, dests of other arguments that set fields), the environment and ``--config``."""
    given = vars(args)
    keys = [key for _, key, _, _ in flags] + list(extra_keys)
    passed = {key: given[key] for key in keys if key in given}
    return load(model, flags=passed, config_file=given.get("config"))

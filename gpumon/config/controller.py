"""The controller's configuration (docs/controller.md): its own module, so that the exporter, which
loads :mod:`gpumon.config` on every GPU node, never imports the controller's models, its pools
and rules (docs/exporter.md, "What the exporter imports")."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from gpumon.config import (
    DEFAULT_EXPORTER_PORT,
    AuthConfig,
    HealthConfig,
    LogConfig,
    ServerConfig,
    Settings,
    TlsConfig,
)
from gpumon.config.numbers import Float, Int
from gpumon.config.pools import PoolConfig, unique_pool_names
from gpumon.config.rules import RuleConfig, resolve_rules
from gpumon.config.section import Section
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER
from gpumon.k8s.resources import GPU_RESOURCE_NAMES, GPU_RESOURCE_PREFIXES

DEFAULT_CONTROLLER_PORT = 9843


def _default_namespace() -> str:
    return os.environ.get("POD_NAMESPACE") or "gpumon-system"


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


class PrometheusSignalsConfig(Section):
    url: str = "http://prometheus-operated.monitoring.svc:9090"
    timeout_seconds: Float = Field(5.0, gt=0, le=120)
    retries: Int = Field(2, ge=0, le=10)
    node_label: str = Field("node", min_length=1)
    bearer_token_file: Path | None = None


class DirectSignalsConfig(Section):
    # Exporter pods are found by namespace and label selector...
    namespace: str = "gpumon-system"
    label_selector: str = "app.kubernetes.io/name=gpumon-exporter"
    port: Int = Field(DEFAULT_EXPORTER_PORT, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    # ...unless given here: node name -> exporter base URL (tests, exporters off-cluster)...
    endpoints: dict[str, str] = Field(default_factory=dict)
    # ...or in the Prometheus file_sd file Prometheus scrapes them from (the demo, exporters
    # off-cluster): one group per exporter, its node in the label targets_node_label, re-read
    # within targets_refresh_seconds of a change (gpumon.wire.file_sd).
    targets_file: Path | None = None
    targets_node_label: str = Field("node", min_length=1)
    targets_refresh_seconds: Float = Field(5.0, gt=0, le=3600)
    # How often a quiet exporter says "nothing changed". None: a third of stale_after_seconds
    # (see SignalsConfig.heartbeat_seconds).
    heartbeat_seconds: Float | None = Field(None, ge=0.1, le=300)
    poll_interval_seconds: Float = Field(5.0, gt=0, le=3600)
    timeout_seconds: Float = Field(5.0, gt=0, le=120)
    max_concurrency: Int = Field(32, ge=1, le=1024)
    bearer_token_file: Path | None = None
    # https: the CA that signed the exporters' certificate (default: the system's trust store),
    # and the name to check it against (exporters are reached by pod IP; their certificate
    # names their Service, as a ServiceMonitor's tlsConfig.serverName does).
    ca_file: Path | None = None
    server_name: str | None = Field(None, min_length=1)
    # One exporter's watch connection may send line_burst lines at once and lines_per_second
    # after (a token bucket); past it the connection is dropped and counted as a "flood". An
    # honest exporter sends a state line per connect, a line per GPU change and a heartbeat.
    lines_per_second: Float = Field(200.0, gt=0, le=1_000_000)
    line_burst: Int = Field(2000, ge=1, le=10_000_000)

    @model_validator(mode="after")
    def _one_list(self) -> DirectSignalsConfig:
        if self.endpoints and self.targets_file is not None:
            raise ValueError("targets_file: give endpoints or targets_file, not both")
        return self


class SignalsConfig(Section):
    source: Literal["prometheus", "direct"] = "prometheus"
    # Prometheus query cadence; with direct signals, transitions are pushed as they happen.
    interval_seconds: Float = Field(10.0, gt=0, le=3600)
    stale_after_seconds: Float = Field(60.0, gt=0)
    prometheus: PrometheusSignalsConfig = Field(default_factory=PrometheusSignalsConfig)
    direct: DirectSignalsConfig = Field(default_factory=DirectSignalsConfig)

    @model_validator(mode="after")
    def _heard_before_stale(self) -> SignalsConfig:
        hb = self.direct.heartbeat_seconds
        if self.source == "direct" and hb is not None and hb >= self.stale_after_seconds:
            raise ValueError(
                f"direct.heartbeat_seconds: {hb:g} is not less than stale_after_seconds "
                f"({self.stale_after_seconds:g}): every quiet node would go stale between heartbeats"
            )
        return self

    @property
    def heartbeat_seconds(self) -> float:
        """The direct source's heartbeat: as configured, or three to a staleness window. Each
        heartbeat is a line for the controller to read: 10,000 streams cost it 0.057 cores with
        10 s heartbeats and 0.035 with 20 s ones (bench stream-costs). With three to the window a
        healthy node goes stale only when two in a row are lost and the third is late."""
        hb = self.direct.heartbeat_seconds
        return self.stale_after_seconds / 3 if hb is None else hb


class PolicyConfig(Section):
    rules_file: Path | None = None
    # Inline rules, merged over the built-ins and the rules file's (gpumon.config.rules).
    rules: list[dict[str, Any]] = Field(default_factory=list)
    builtin_rules: bool = True
    recover_after_seconds: Float = Field(900.0, ge=0)
    flap_window_seconds: Float = Field(3600.0, gt=0)
    flap_max_onsets: Int = Field(3, ge=2)
    # Xid classes and overrides, Xid window and thermal limits: the exporter's knobs, reused.
    health: HealthConfig = Field(default_factory=HealthConfig)
    _effective_rules: tuple[RuleConfig, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _read_rules(self) -> PolicyConfig:
        # The rules file is read and every rule validated here, as config loads. A bad rule is
        # a ConfigError, not a ValueError: pydantic lets it through unchanged, so its message
        # keeps naming the rule, its file and entry, which pydantic's own would not.
        self._effective_rules = resolve_rules(
            inline=self.rules,
            rules_file=self.rules_file,
            builtin=self.builtin_rules,
            health=self.health.policy(),
        )
        return self

    @property
    def effective_rules(self) -> tuple[RuleConfig, ...]:
        """Built-ins, the rules file's and inline rules, merged by name; disabled ones left out."""
        return self._effective_rules


class QuarantineConfig(Section):
    cordon: bool = False
    # Mark an unhealthy GPU's DRA devices NoSchedule with DeviceTaintRules (resource.k8s.io/v1beta2),
    # where the API server serves them; docs/controller.md, "DRA device taints".
    device_taints: bool = True


class DrainConfig(Section):
    enabled: bool = True
    on_degraded: bool = False
    deadline_seconds: Float = Field(600.0, gt=0)
    escalation: Literal["report", "delete"] = "report"
    retry_initial_seconds: Float = Field(5.0, gt=0)
    retry_max_seconds: Float = Field(60.0, gt=0)
    # What makes a pod a GPU pod (drained from a bad GPU, counted as demand): by default every
    # GPU resource gpumon knows (gpumon/k8s/resources.py), shared and Windows ones included.
    gpu_resource_names: tuple[str, ...] = GPU_RESOURCE_NAMES
    gpu_resource_prefixes: tuple[str, ...] = GPU_RESOURCE_PREFIXES
    # DRA drivers whose devices are GPUs: a pod whose ResourceClaim holds one is a GPU pod, and
    # the driver's ResourceSlices say which GPU each device is (docs/controller.md, "DRA").
    gpu_dra_drivers: tuple[str, ...] = (NVIDIA_GPU_DRIVER,)


class BreakerConfig(Section):
    enabled: bool = True
    min_nodes: Int = Field(2, ge=1)
    max_fraction: Float = Field(0.2, gt=0, le=1)
    window_seconds: Float = Field(3600.0, gt=0)
    pool_label: str = Field("gpumon.io/pool", min_length=1)


class RateLimitConfig(Section):
    max_quarantines: Int = Field(5, ge=1)
    window_seconds: Float = Field(600.0, gt=0)


class LeaderConfig(Section):
    enabled: bool = True
    lease_name: str = Field("gpumon-controller", min_length=1)
    lease_duration_seconds: Float = Field(15.0, ge=1)
    renew_deadline_seconds: Float = Field(10.0, gt=0)
    retry_period_seconds: Float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderConfig:
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError("need retry_period_seconds < renew_deadline_seconds < lease_duration_seconds")
        return self


class ControllerConfig(Settings):
    # A fresh install only reports what it would do: every decision is logged and recorded as
    # an Event, nothing is changed. Set false to act.
    dry_run: bool = True
    paused: bool = False
    namespace: str = Field(default_factory=_default_namespace, min_length=1)
    identity: str = Field(default_factory=_default_identity, min_length=1)
    # The ConfigMap (in `namespace`) holding open breakers and the runtime pause switch.
    state_configmap: str = Field("gpumon-controller", min_length=1)
    kubeconfig: Path | None = None
    listen_address: str = "0.0.0.0"
    port: Int = Field(DEFAULT_CONTROLLER_PORT, ge=0, le=65535)
    # The controller's own server (/metrics, /healthz, /readyz): the exporter's options.
    tls: TlsConfig = Field(default_factory=TlsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    # Label selector of the nodes the controller manages ("" = all).
    node_selector: str = ""
    signals: SignalsConfig = Field(default_factory=SignalsConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    quarantine: QuarantineConfig = Field(default_factory=QuarantineConfig)
    drain: DrainConfig = Field(default_factory=DrainConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)
    leader: LeaderConfig = Field(default_factory=LeaderConfig)
    # GPU node pools to autoscale (docs/autoscaling.md); none by default.
    pools: list[PoolConfig] = Field(default_factory=list)
    server: ServerConfig = Field(default_factory=ServerConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("pools")
    @classmethod
    def _pools(cls, v: list[PoolConfig]) -> list[PoolConfig]:
        return unique_pool_names(v)

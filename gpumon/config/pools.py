"""GPU node pools as declared in config (``ControllerConfig.pools``; docs/autoscaling.md).

Declarations only, validated when config loads; the controller turns them into its frozen
``Pool`` values (gpumon.controller.configure).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from gpumon.config.numbers import Float, Int, NoBool
from gpumon.config.repair import RepairConfig
from gpumon.config.section import Section
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, DeviceRef, SliceDevice, qualified
from gpumon.k8s.resources import (
    CGPU_CORE_RESOURCE,
    GPUSHARE_COUNT_RESOURCE,
    GPUSHARE_MEMORY_RESOURCE,
    gpu_only,
    milli,
    whole_quantity,
)
from gpumon.k8s.selectors import parse_selector

# Karpenter's API group: its NodePools have a /scale subresource (static capacity), but what
# Karpenter manages gpumon never scales (docs/autoscaling.md, "Two autoscalers never share a pool").
KARPENTER_GROUP = "karpenter.sh"


class TargetConfig(Section):
    group: str = "cluster.x-k8s.io"
    version: str = Field("v1beta2", min_length=1)
    kind: str = Field("MachineDeployment", min_length=1)
    # The plural resource name in the URL; derived from kind when left out.
    resource: str | None = None
    namespace: str = Field(..., min_length=1)
    name: str = Field(..., min_length=1)

    @field_validator("group")
    @classmethod
    def _not_karpenter(cls, v: str) -> str:
        if v == KARPENTER_GROUP:
            raise ValueError(
                f"{v} is Karpenter's: gpumon never scales what Karpenter manages "
                "(Karpenter sizes its NodePools itself)"
            )
        return v


class TaintConfig(Section):
    key: str = Field(..., min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class SharedGpusConfig(Section):
    """gpushare/cGPU: the node's GPUs are split by memory (``aliyun.com/gpu-mem`` units per
    card, GiB by default) and core percentage (100 per card)."""

    cards: Int = Field(..., ge=1, le=64)
    memory_per_card: Int = Field(..., ge=1)


# resource.k8s.io/v1: a device name is a DNS label; an attribute or capacity name a C identifier
# of at most 32 characters, optionally qualified by a DNS subdomain ("domain/name").
_DEVICE_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_ATTRIBUTE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")


def _names_ok(names: list[str]) -> None:
    bad = sorted(n for n in names if not _ATTRIBUTE_NAME.match(n))
    if bad:
        raise ValueError("not an attribute name (a C identifier, optionally domain/): " + ", ".join(bad))


class DraDeviceConfig(Section):
    """One device, or ``count`` alike, of the ResourceSlice a new node publishes. With a count,
    they are named ``<name>-0`` ... (NVIDIA's driver names GPUs ``gpu-<minor>``)."""

    name: str = Field(..., pattern=_DEVICE_NAME)
    count: Int = Field(1, ge=1, le=512)
    # type, productName, profile, uuid...: NVIDIA's names, unqualified names in the driver's domain.
    attributes: dict[str, StrictBool | StrictInt | StrictStr] = Field(default_factory=dict)
    # Quantities in whole base units: {"memory": "80Gi"}.
    capacity: dict[str, Annotated[str | int, NoBool]] = Field(default_factory=dict)

    @field_validator("attributes")
    @classmethod
    def _attribute_names(cls, v: dict[str, bool | int | str]) -> dict[str, bool | int | str]:
        _names_ok(list(v))
        return v

    @field_validator("capacity")
    @classmethod
    def _capacities(cls, v: dict[str, str | int]) -> dict[str, str | int]:
        _names_ok(list(v))
        bad = [k for k, q in v.items() if (x := whole_quantity(q)) is None or x < 0]
        if bad:
            raise ValueError("not a whole quantity: " + ", ".join(f"{k}={v[k]!r}" for k in sorted(bad)))
        return v


class DraConfig(Section):
    """The devices a new node of the pool publishes in its ResourceSlice (Dynamic Resource
    Allocation), as its DRA driver will: what pending pods' claims are allocated on."""

    driver: str = Field(NVIDIA_GPU_DRIVER, min_length=1)
    devices: list[DraDeviceConfig] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> DraConfig:
        names = [d.ref.device for d in self.slice_devices("")]
        if len(set(names)) != len(names):
            raise ValueError("device names must be unique (counted devices are <name>-<i>)")
        return self

    def slice_devices(self, pool: str) -> tuple[SliceDevice, ...]:
        """The devices, as :func:`gpumon.k8s.dra.slice_devices` reads them off a published slice."""
        out = []
        for d in self.devices:
            names = [d.name] if d.count == 1 else [f"{d.name}-{i}" for i in range(d.count)]
            attributes = {qualified(k, self.driver): v for k, v in d.attributes.items()}
            capacity = {qualified(k, self.driver): whole_quantity(q) or 0 for k, q in d.capacity.items()}
            out += [SliceDevice(DeviceRef(self.driver, pool, n), attributes, capacity) for n in names]
        return tuple(out)


class TemplateConfig(Section):
    # Allocatable resources of one node, as quantities: {"nvidia.com/gpu": 8, "cpu": "96", ...}.
    resources: dict[str, Annotated[str | int, NoBool]] = Field(default_factory=dict)
    shared_gpus: SharedGpusConfig | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintConfig] = Field(default_factory=list)
    dra: DraConfig | None = None

    @field_validator("resources")
    @classmethod
    def _quantities(cls, v: dict[str, str | int]) -> dict[str, str | int]:
        bad = [k for k, q in v.items() if milli(q) is None or (milli(q) or 0) < 0]
        if bad:
            raise ValueError("not a quantity: " + ", ".join(f"{k}={v[k]!r}" for k in sorted(bad)))
        return v

    @model_validator(mode="after")
    def _has_gpus(self) -> TemplateConfig:
        if not gpu_only(self.allocatable()) and self.dra is None:
            raise ValueError("a GPU pool's template needs a GPU resource (resources, shared_gpus or dra)")
        return self

    def allocatable(self) -> dict[str, int]:
        """What one node offers, in thousandths, the shared GPUs' resources included."""
        out = {name: milli(q) or 0 for name, q in self.resources.items()}
        if self.shared_gpus is not None:
            s = self.shared_gpus
            out.setdefault(GPUSHARE_MEMORY_RESOURCE, s.cards * s.memory_per_card * 1000)
            out.setdefault(GPUSHARE_COUNT_RESOURCE, s.cards * 1000)
            out.setdefault(CGPU_CORE_RESOURCE, s.cards * 100 * 1000)
        return out


class PoolConfig(Section):
    name: str = Field(..., min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    target: TargetConfig
    # Label selector of the pool's nodes, e.g. "cluster.x-k8s.io/deployment-name=gpu-a".
    node_selector: str = Field(..., min_length=1)
    template: TemplateConfig
    # None: taken from cluster-autoscaler's annotations when allow_cluster_autoscaler is set.
    min_replicas: Int | None = Field(None, ge=0)
    max_replicas: Int | None = Field(None, ge=0)
    max_step: Int = Field(10, ge=1)
    scale_up_cooldown_seconds: Float = Field(0.0, ge=0)
    scale_down_cooldown_seconds: Float = Field(300.0, ge=0)
    scale_down_unneeded_seconds: Float = Field(600.0, ge=0)
    scale_down_drain_timeout_seconds: Float = Field(600.0, gt=0)
    arriving_timeout_seconds: Float = Field(900.0, gt=0)
    headroom_nodes: Int = Field(0, ge=0)
    replace_quarantined: bool = True
    allow_cluster_autoscaler: bool = False
    # The repair ladder (gpumon.config.repair); None: off, quarantined nodes wait for a person.
    repair: RepairConfig | None = None

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: str) -> str:
        parse_selector(v)
        return v

    @model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if self.max_replicas is None and not self.allow_cluster_autoscaler:
            raise ValueError(
                "max_replicas is required (or allow_cluster_autoscaler to read it from the target)"
            )
        if (
            self.min_replicas is not None
            and self.max_replicas is not None
            and self.min_replicas > self.max_replicas
        ):
            raise ValueError("min_replicas must be <= max_replicas")
        return self


def unique_pool_names(pools: list[PoolConfig]) -> list[PoolConfig]:
    """For ControllerConfig: pool names and targets are unique (one writer per target)."""
    names = [p.name for p in pools]
    targets = [(p.target.group, p.target.kind, p.target.namespace, p.target.name) for p in pools]
    if len(set(names)) != len(names):
        raise ValueError("pool names must be unique")
    if len(set(targets)) != len(targets):
        raise ValueError("two pools name the same target")
    return pools

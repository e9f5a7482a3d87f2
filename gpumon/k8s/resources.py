"""Kubernetes resources that GPUs are requested by, and resource quantities. Pure: no I/O.

Below both programs and the config layer: the exporter reads these names off pods (shared-GPU
allocations), pool templates in config declare them, and the controller's demand planner
counts them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import MAX_EMAX, MIN_EMIN, ROUND_UP, Context, Decimal, localcontext

NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
NVIDIA_MIG_PREFIX = "nvidia.com/mig-"
# Alibaba gpushare / cGPU: memory units summed over the node's cards (GiB by default), card
# count, and core percentage at 100 per card.
GPUSHARE_MEMORY_RESOURCE = "aliyun.com/gpu-mem"
GPUSHARE_COUNT_RESOURCE = "aliyun.com/gpu-count"
CGPU_CORE_RESOURCE = "aliyun.com/gpu-core.percentage"
# cGPU shares a card's SMs in steps of this many percent, at least one step: ACK refuses a job
# asking for another value ("Allocate computing power by scheduling shared GPU", Limitations).
CGPU_CORE_STEP = 5
# HAMi (Project-HAMi/HAMi, cmd/device-plugin/nvidia flags --resource-mem,
# --resource-mem-percentage, --resource-cores): a vGPU's memory in MiB, or in percent of the
# card, and its share of the card's SMs in percent; the vGPU count is nvidia.com/gpu.
HAMI_MEMORY_RESOURCE = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE_RESOURCE = "nvidia.com/gpumem-percentage"
HAMI_CORE_RESOURCE = "nvidia.com/gpucores"
# Alibaba's DirectX device plugin for Windows nodes (ACK, directx-device-plugin-windows): a
# container asking for it gets the host's GPUs through DirectX, shared, with no card named.
DIRECTX_RESOURCE = "windows.alibabacloud.com/directx"
# NVIDIA's device plugin with time-slicing and renameByDefault: replicas of whole GPUs.
NVIDIA_SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"

GPU_RESOURCE_NAMES: tuple[str, ...] = (
    NVIDIA_GPU_RESOURCE,
    NVIDIA_SHARED_GPU_RESOURCE,
    GPUSHARE_MEMORY_RESOURCE,
    GPUSHARE_COUNT_RESOURCE,
    CGPU_CORE_RESOURCE,
    HAMI_MEMORY_RESOURCE,
    HAMI_MEMORY_PERCENTAGE_RESOURCE,
    HAMI_CORE_RESOURCE,
    DIRECTX_RESOURCE,
)
"""Every resource gpumon knows a pod is given (a share of) a GPU by: the controller's default
idea of a GPU pod, for drain and for demand."""
GPU_RESOURCE_PREFIXES: tuple[str, ...] = (NVIDIA_MIG_PREFIX,)
"""Resource-name prefixes that are GPUs too (one resource per MIG profile)."""
GPU_COUNT_RESOURCES = frozenset({NVIDIA_GPU_RESOURCE, GPUSHARE_COUNT_RESOURCE, DIRECTX_RESOURCE})
"""The GPU resources whose quantity is a number of GPUs (a node's cards, a pod's whole GPUs);
the others measure shares of one (GiB, percent) or slices (MIG instances, time-sliced replicas)."""

PODS = "pods"
# Resources every node has: never what makes a node (or a pod) a GPU one.
NODE_BASICS = frozenset({"cpu", "memory", PODS, "ephemeral-storage"})


def gpu_only(resources: Iterable[str]) -> frozenset[str]:
    """The resources among ``resources`` that only GPU nodes have."""
    return frozenset(r for r in resources if r not in NODE_BASICS and not r.startswith("hugepages-"))


# Kubernetes' quantity (k8s.io/apimachinery resource.ParseQuantity, which the API server decodes
# every quantity with): a sign, a number with an optional decimal point, then a binary SI suffix,
# a decimal SI one (n, u, m, none, k ... E) or an integral exponent. Deliberate differences, all
# refusals: a number without a digit ("+", ".", "Gi", "e3"), which ParseQuantity reads as 0 but
# the API server never serves (it writes "0") and a config file holds only as a typo; an
# exponent beyond an int32, which ParseQuantity wraps into another number; and a magnitude
# beyond 2^63 - 1, which no int64 reader of the API holds (ParseQuantity caps binary SI there).
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_SCALE: Mapping[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_NANO = Decimal("1e-9")
_LARGEST = Decimal(2**63 - 1)
_INT32_DIGITS = 10


def quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity (``"500m"``, ``"16Gi"``, ``"1e3"``, ``2``) as its exact value, kept
    to the nano as the API server keeps it (a finer non-zero value rounds away from zero); None
    when it is not one. Surrounding whitespace is ignored, as the API server's JSON decoder does."""
    m = _QUANTITY.fullmatch(str(value).strip())
    if m is None:
        return None
    written = m["exponent"] or "0"
    digits = written.lstrip("+-").lstrip("0") or "0"
    if len(digits) > _INT32_DIGITS:
        return None
    exponent = -int(digits) if written.startswith("-") else int(digits)
    if not -(2**31) <= exponent < 2**31:
        return None
    # Exact: enough digits for the whole text, and room for any int32 exponent.
    with localcontext(Context(prec=len(m.string) + 40, Emax=MAX_EMAX, Emin=MIN_EMIN)):
        exact = Decimal(m["number"]).scaleb(exponent) * _SCALE[m["suffix"] or ""]
        if abs(exact) > _LARGEST:
            return None
        return exact.quantize(_NANO, rounding=ROUND_UP) if exact % _NANO else exact


def whole_quantity(value: object) -> int | None:
    """A quantity whose value is a whole number, as an int (an extended resource's, such as
    gpushare's ``aliyun.com/gpu-mem``: the API server refuses a fraction of one); None when it
    is not one."""
    exact = quantity(value)
    if exact is None or exact != exact.to_integral_value():
        return None
    return int(exact)


def milli(value: object) -> int | None:
    """A Kubernetes quantity in thousandths, rounded up as the API server rounds requests; None
    when it is not one."""
    exact = quantity(value)
    if exact is None:
        return None
    amount = exact * 1000
    whole = int(amount)
    return whole + (1 if amount > whole else 0)


def units(amount: int) -> str:
    """Thousandths back to a short number for people (``2``, ``0.5``)."""
    return str(amount // 1000) if amount % 1000 == 0 else f"{amount / 1000:g}"

"""Kubernetes objects with missing, null and odd fields through the controller's converters
(gpumon.controller.core.objects, demand.pending_gpu_pod, pools.pool_node_from_json) and the
allocation view of `gpumon status allocation`. The API
server guarantees each kind's structure and types (an object where the schema has one, a list of
objects, an integer, a string), not which fields are set nor what their strings say: so the
objects here are real ones with fields dropped or nulled, list items dropped, and scalars given
another value of their type (any string: a quantity "abc", a time "not a time"), and each
converter returns a value."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import FUZZ, scalars, strings

from gpumon.controller.core.claims import claim_from_json, slice_from_json
from gpumon.controller.core.demand import Template, pending_gpu_pod
from gpumon.controller.core.device_claims import TemplateDevices, claim_requests, device_class_view, resolve
from gpumon.controller.core.device_taints import rule_from_json
from gpumon.controller.core.objects import (
    GpuResources,
    from_rfc3339,
    node_from_json,
    pdb_from_json,
    pod_from_json,
)
from gpumon.controller.core.pools import pool_node_from_json
from gpumon.k8s.dra import DeviceRef, SliceDevice
from gpumon.k8s.dra_cel import SelectorError, compile_selector
from gpumon.status.allocation import build_allocation

NODE: dict[str, Any] = {
    "metadata": {
        "name": "gpu-1",
        "uid": "u",
        "resourceVersion": "7",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {"pool": "a", "nvidia.com/gpu.product": "A100"},
        "annotations": {"gpumon.io/quarantined-at": "2026-01-01T00:00:00Z", "gpumon.io/removing": "x"},
    },
    "spec": {
        "unschedulable": True,
        "providerID": "kwok://gpu-1",
        "taints": [{"key": "gpumon.io/unhealthy", "value": "x", "effect": "NoSchedule", "timeAdded": "x"}],
    },
    "status": {
        "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
        "conditions": [
            {
                "type": "GpuHealthy",
                "status": "False",
                "reason": "Xid",
                "message": "m",
                "lastTransitionTime": "t",
            },
            {"type": "Ready", "status": "True"},
        ],
    },
}

POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ml",
        "uid": "u",
        "labels": {"app": "train"},
        "annotations": {"kubernetes.io/config.mirror": "x"},
        "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}],
        "deletionTimestamp": None,
        "creationTimestamp": "2026-01-01T00:00:00Z",
    },
    "spec": {
        "nodeName": "gpu-1",
        "nodeSelector": {"pool": "a"},
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "containers": [
            {
                "name": "c",
                "resources": {
                    "requests": {"nvidia.com/gpu": "1", "cpu": "1"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
            }
        ],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
        "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "shared", "resourceClaimName": "team-gpus"},
        ],
    },
    "status": {
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x2k9d"}],
        "extendedResourceClaimStatus": {
            "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "r"}],
            "resourceClaimName": "p-extended-resources-8hx2k",
        },
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    },
}

PDB: dict[str, Any] = {
    "metadata": {"name": "b", "namespace": "ml"},
    "spec": {
        "selector": {
            "matchLabels": {"app": "train"},
            "matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}],
        }
    },
    "status": {"disruptionsAllowed": 1},
}

CLAIM: dict[str, Any] = {
    "metadata": {"name": "p-gpu-x2k9d", "namespace": "ml", "uid": "u"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-0"},
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "gpu-1",
                        "device": "gpu-1",
                        "shareID": "s",
                    },
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
    },
}

SLICE: dict[str, Any] = {
    "metadata": {"name": "gpu-1-gpu.nvidia.com"},
    "spec": {
        "driver": "gpu.nvidia.com",
        "nodeName": "gpu-1",
        "pool": {"name": "gpu-1", "generation": 3, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}},
                "capacity": {"memory": {"value": "80Gi"}},
            },
            {
                "name": "gpu-1-mig-9-0-4",
                "attributes": {
                    "type": {"string": "mig"},
                    "uuid": {"string": "MIG-1"},
                    "parentUUID": {"string": "GPU-1"},
                    "profile": {"string": "3g.40gb"},
                },
            },
        ],
    },
}

RULE: dict[str, Any] = {
    "metadata": {
        "name": "gpumon-gpu-0-0123456789",
        "labels": {"app.kubernetes.io/managed-by": "gpumon"},
        "annotations": {"gpumon.io/node": "gpu-1", "gpumon.io/gpu-uuid": "GPU-0"},
    },
    "spec": {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-0"},
        "taint": {"key": "gpumon.io/gpu-unhealthy", "value": "unhealthy", "effect": "NoSchedule"},
    },
}

TEMPLATE = Template(resources={"nvidia.com/gpu": 8000, "cpu": 64000, "pods": 110000})


def _scalar_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [prefix] + [p for k, v in doc.items() for p in _scalar_paths(v, (*prefix, k))]
    if isinstance(doc, list):
        return [prefix] + [p for i, v in enumerate(doc) for p in _scalar_paths(v, (*prefix, i))]
    return [prefix]


def _edit(doc: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    if len(path) == 1:
        copy = dict(doc) if isinstance(doc, dict) else list(doc)
        key = path[0]
        if how == "drop" or (how == "null" and isinstance(doc, list)):  # lists hold no nulls
            del copy[key]
        elif how == "null":
            copy[key] = None
        elif type(doc[key]) is type(value):  # a scalar gets another value of its type
            copy[key] = value
        return copy
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = _edit(doc[path[0]], path[1:], how, value)
    return copy


@st.composite
def damaged(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    doc = base
    for _ in range(draw(st.integers(1, 6))):
        paths = [p for p in _scalar_paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["drop", "null", "scalar"]))
        value = draw(st.one_of(strings, st.integers(-(2**63), 2**63 - 1), st.booleans()))
        doc = _edit(doc, path, how, value)
    return doc


@FUZZ
@given(damaged(NODE))
def test_a_node_converts(obj: dict[str, Any]) -> None:
    node_from_json(obj)
    pool_node_from_json(obj, TEMPLATE)


@FUZZ
@given(damaged(POD))
def test_a_pod_converts(obj: dict[str, Any]) -> None:
    pod_from_json(obj, GpuResources())
    pending_gpu_pod(obj, GpuResources(), from_rfc3339)


@FUZZ
@given(damaged(CLAIM), damaged(SLICE), damaged(RULE))
def test_dra_objects_convert(claim: dict[str, Any], slice_: dict[str, Any], rule: dict[str, Any]) -> None:
    drivers = frozenset({"gpu.nvidia.com"})
    claim_from_json(claim, drivers)
    slice_from_json(slice_, drivers)
    rule_from_json(rule)


@FUZZ
@given(damaged(PDB))
def test_a_pdb_converts(obj: dict[str, Any]) -> None:
    pdb_from_json(obj)


@FUZZ
@given(st.one_of(scalars, st.text()))
def test_a_timestamp_is_a_time_or_none(text: Any) -> None:
    assert from_rfc3339(str(text)) is None or isinstance(from_rfc3339(str(text)), float)


SHARED_NODE: dict[str, Any] = {
    "metadata": {
        "name": "gpu-1",
        "annotations": {
            "hami.io/node-nvidia-register": "GPU-a,10,32768,100,NVIDIA-A100,0,true,0,hami-core:",
        },
    },
    "status": {
        "capacity": {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "32", "nvidia.com/gpu": "4"},
        "allocatable": {
            "aliyun.com/gpu-count": "2",
            "aliyun.com/gpu-mem": "32",
            "nvidia.com/mig-1g.10gb": "7",
        },
    },
}
SHARED_POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ml",
        "annotations": {
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,4096,25:;",
        },
    },
    "spec": {
        "nodeName": "gpu-1",
        "containers": [
            {
                "name": "c",
                "resources": {
                    "limits": {"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"},
                    "requests": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"},
                },
            }
        ],
    },
    "status": {"phase": "Running"},
}


@FUZZ
@given(damaged(SHARED_NODE), st.lists(damaged(SHARED_POD), max_size=3))
def test_the_allocation_view_is_built_from_any_node_and_pods(
    node: dict[str, Any], pods: list[dict[str, Any]]
) -> None:
    build_allocation("2026-01-01T00:00:00Z", [node], pods)


BIG_GPU = 'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))'
PENDING_CLAIM: dict[str, Any] = {
    "metadata": {"name": "p-gpu-x2k9d", "namespace": "ml", "uid": "u"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [{"cel": {"expression": BIG_GPU}}],
                    },
                }
            ]
        }
    },
    "status": {},
}
DEVICE_CLASS: dict[str, Any] = {
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
}


@FUZZ
@given(damaged(PENDING_CLAIM), damaged(DEVICE_CLASS), st.text(max_size=80))
def test_dra_demand_objects_and_selectors_convert(
    claim: dict[str, Any], device_class: dict[str, Any], expression: str
) -> None:
    """A pending claim, its DeviceClass and any CEL text: the autoscaler's views, resolution and
    evaluation on a template's devices give a value or a reason, never an exception."""
    view = claim_requests(claim, compile_selector)
    dc = device_class_view(device_class, compile_selector)
    resolved = resolve([view], {dc.name: dc})
    gpu = SliceDevice(
        DeviceRef("gpu.nvidia.com", "n", "gpu-0"),
        {"gpu.nvidia.com/type": "gpu", "gpu.nvidia.com/productName": "H100"},
        {"gpu.nvidia.com/memory": 80 * 2**30},
    )
    devices = TemplateDevices([gpu, gpu])
    claims = [c for c in resolved if not isinstance(c, str)]
    devices.unevaluable(claims)  # type: ignore[arg-type]
    devices.allocate(claims, [True, True])  # type: ignore[arg-type]
    with contextlib.suppress(SelectorError):  # the documented error: reported as unevaluable
        compile_selector(expression)(gpu)

"""Garbage from the other sources the programs read: a Prometheus query answer (the controller's
prometheus signal source), a /proc/<pid>/cgroup file and a kubelet pod-resources reply (the
exporter's pod attribution)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import FUZZ, json_objects, json_values, strings

from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.promql import detail_queries, queries_for
from gpumon.controller.shell.signal_sources.prometheus import (
    Sample,
    named,
    parse_vector,
    readings_from_results,
)
from gpumon.exporter.cgroups import ContainerKey, Unmatched, parse_cgroup
from gpumon.exporter.podresources import api_pb2
from gpumon.exporter.podresources.protowire import DecodeError
from gpumon.exporter.podresources_client import DeviceAssignment, view_from_response
from gpumon.k8s.dra import NVIDIA_GPU_DRIVER, ClaimDevice

RULES = build_policy(ControllerConfig()).rules
QUERY_NAMES = [*queries_for(RULES, 600.0), *detail_queries(RULES, ["a"])]
LABELS = [
    "node",
    "uuid",
    "gpu",
    "xid",
    "state",
    "reason",
    "detail",
    "namespace",
    "pod",
    "container",
    "__name__",
]

label_values = st.one_of(
    strings, st.sampled_from(["0", "1", "7", "²", "٣", "-1", "00", "1" * 40, "A0", "gpu-1"])
)
gpu_labels = st.one_of(st.sampled_from(["0", "1", "²", "٣", "", "x", "-1"]), label_values)
# Most series carry the labels that place them on a GPU, so they get past the first lookup.
metrics = st.one_of(
    st.fixed_dictionaries(
        {"node": st.sampled_from(["a", "b"]), "uuid": st.sampled_from(["A0", "A1"]), "gpu": gpu_labels},
        optional={k: label_values for k in LABELS if k not in ("node", "uuid", "gpu")},
    ),
    st.dictionaries(st.sampled_from(LABELS), label_values, max_size=6),
)
samples = st.builds(
    dict,
    metric=metrics,
    value=st.tuples(
        st.floats(), st.one_of(st.floats().map(str), strings, st.integers(-(10**400), 10**400))
    ).map(list),
)
answers = st.one_of(
    json_objects,
    st.builds(
        lambda result, extra: {
            "status": "success",
            "data": {"resultType": "vector", "result": result, **extra},
        },
        st.lists(st.one_of(samples, json_values), max_size=8),
        st.dictionaries(st.sampled_from(["resultType", "result"]), json_values, max_size=1),
    ),
)


@FUZZ
@given(answers)
def test_a_query_answer_is_samples_or_a_value_error(doc: dict[str, Any]) -> None:
    # What the source does with a body: json.loads, then parse_vector (ValueError is a refusal).
    doc = json.loads(json.dumps(doc))
    with contextlib.suppress(ValueError):
        parse_vector(doc)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(QUERY_NAMES), st.lists(st.builds(Sample, metrics, st.floats()), max_size=6)
    ),
    st.floats(),
)
def test_any_samples_fold_into_readings(results: dict[str, list[Sample]], now: float) -> None:
    named(results, RULES)
    readings_from_results(results, RULES, now=now)


cgroup_lines = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.builds(
            lambda n, c, path: f"{n}:{c}:{path}",
            st.sampled_from(["0", "1", "12", "x", ""]),
            st.sampled_from(["", "cpu,cpuacct", "memory", "name=systemd"]),
            st.lists(
                st.one_of(
                    st.sampled_from(
                        [
                            "kubepods.slice",
                            "kubepods-burstable.slice",
                            "kubepods-burstable-pod1234_5678.slice",
                            "pod1234-5678",
                            "cri-containerd-abc123.scope",
                            "crio-conmon-abc.scope",
                            "docker-abc.scope",
                            "abc123",
                            "kubepods",
                            "besteffort",
                        ]
                    ),
                    st.text(max_size=12),
                ),
                max_size=6,
            ).map(lambda parts: "/" + "/".join(parts)),
        ),
        max_size=4,
    ).map("\n".join),
)


@FUZZ
@given(cgroup_lines)
def test_a_cgroup_file_names_a_container_or_says_why_not(text: str) -> None:
    assert isinstance(parse_cgroup(text), ContainerKey | Unmatched)


def _reply(pods: list[Any]) -> api_pb2.ListPodResourcesResponse:
    reply = api_pb2.ListPodResourcesResponse()
    for name, namespace, containers in pods:
        pod = reply.pod_resources.add(name=name, namespace=namespace)
        for cname, devices, claims in containers:
            c = pod.containers.add(name=cname)
            for resource, ids in devices:
                c.devices.add(resource_name=resource, device_ids=ids)
            for claim_name, claim_namespace, resources in claims:
                dr = c.dynamic_resources.add(claim_name=claim_name, claim_namespace=claim_namespace)
                for driver, pool, device, share in resources:
                    dr.claim_resources.add(
                        driver_name=driver, pool_name=pool, device_name=device, share_id=share
                    )
    return reply


text = st.text(max_size=10)
replies = st.one_of(
    st.binary(max_size=200).map(lambda raw: raw),
    st.lists(
        st.tuples(
            text,
            text,
            st.lists(
                st.tuples(
                    text,
                    st.lists(
                        st.tuples(st.sampled_from(["nvidia.com/gpu", "x", ""]), st.lists(text, max_size=3)),
                        max_size=3,
                    ),
                    st.lists(  # DRA claims: (name, namespace, [(driver, pool, device, share_id)])
                        st.tuples(
                            text,
                            text,
                            st.lists(
                                st.tuples(
                                    st.sampled_from([NVIDIA_GPU_DRIVER, "nic.example.com", ""]),
                                    text,
                                    text,
                                    st.none() | text,
                                ),
                                max_size=3,
                            ),
                        ),
                        max_size=2,
                    ),
                ),
                max_size=3,
            ),
        ),
        max_size=4,
    ).map(_reply),
)


@FUZZ
@given(replies)
def test_a_pod_resources_reply_is_a_view_or_a_decode_error(reply: Any) -> None:
    # What the wire could carry (bytes), or a reply protobuf itself serializes.
    wire = reply if isinstance(reply, bytes) else reply.SerializeToString()
    try:
        view = view_from_response(wire, lambda r: r == "nvidia.com/gpu", frozenset({NVIDIA_GPU_DRIVER}))
    except DecodeError:
        assert isinstance(reply, bytes)
        return
    assert all(isinstance(k, tuple) for k in view)
    for containers in view.values():
        for held in containers.values():
            for a in held:
                assert isinstance(a, DeviceAssignment) or (
                    isinstance(a, ClaimDevice) and a.device.driver == NVIDIA_GPU_DRIVER and a.device.device
                )

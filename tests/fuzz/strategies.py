"""Garbage for the fuzz tier: JSON-like values shaped like what the parsers read (the keys they
look for, with values of every type), bytes and text, and the one settings profile.

The profile is derandomized: CI runs the same examples every time, so the tier cannot flake,
and a failure reproduces on any machine. ``GPUMON_FUZZ_EXAMPLES`` raises the count (and
``GPUMON_FUZZ_RANDOM=1`` draws new examples) for a longer hunt by hand."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=int(os.environ.get("GPUMON_FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=os.environ.get("GPUMON_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every key the parsers on a trust boundary look up, so generated objects reach past the first
# lookup; plus any text.
KEYS = [
    "schema",
    "node",
    "time",
    "type",
    "gpus",
    "gpu",
    "uuid",
    "index",
    "health",
    "state",
    "reasons",
    "code",
    "detail",
    "previous",
    "temperature_celsius",
    "ecc_uncorrected",
    "row_remap_pending",
    "row_remap_failure",
    "lost",
    "xids",
    "at",
    "count",
    "pods",
    "namespace",
    "pod",
    "container",
    "uid",
    "backend_up",
    "taken_at",
    "complete",
    "driver",
    "identity",
    "fast",
    "slow",
    "sampled_at",
    "xid_counts",
    "last_xid",
    "memory",
    "processes",
    "mig_instances",
    "metadata",
    "name",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "kind",
    "spec",
    "status",
    "conditions",
    "reason",
    "message",
    "lastTransitionTime",
    "taints",
    "key",
    "value",
    "effect",
    "timeAdded",
    "unschedulable",
    "allocatable",
    "capacity",
    "nodeName",
    "nodeSelector",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "nodeSelectorTerms",
    "matchExpressions",
    "operator",
    "values",
    "tolerations",
    "containers",
    "initContainers",
    "resources",
    "requests",
    "limits",
    "phase",
    "selector",
    "matchLabels",
    "minAvailable",
    "maxUnavailable",
    "disruptionsAllowed",
    "currentHealthy",
    "desiredHealthy",
    "expectedPods",
    "providerID",
    "replicas",
    "data",
    "result",
    "resultType",
    "metric",
    "errorType",
    "error",
]

strings = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "0", "1", "-1", "1e999", "nan", "abc", "1.5", "100m", "2Ki", "true", "Z"]),
    st.sampled_from(["2026-01-01T00:00:00Z", "not a time", "9999-99-99T99:99:99Z", "0001-01-01T00:00:00"]),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),
    strings,
)

keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8))

json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(keys, inner, max_size=6),
    ),
    max_leaves=40,
)

json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(keys, json_values, max_size=8)

"""One controller process lists and watches each (resource, selectors) once, however many of its
loops read it: counted by the API server itself, from its audit log of watches (the devcluster
starts kube-apiserver with an audit policy that records every watch as it starts,
gpumon/devcluster/components.py). The controller runs with everything that reads the API on:
remediation, a device-plugin pool and a DRA pool (the autoscaler's pending pods, per-pool nodes,
ResourceClaims and DeviceClasses), exporters discovered through the API, DeviceTaintRules."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controller_harness import (  # noqa: F401 - fixtures
    SA,
    TEST_LABEL,
    KubeconfigFactory,
    controller_config,
    running,
    sa_kubeconfig_for_fixture,
)

from gpumon.devcluster import nodes, resourceslices
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodes import POOL_LABEL
from gpumon.devcluster.waiting import eventually
from gpumon.kube.informer import Selection

Key = tuple[str, str, str]  # path, labelSelector, fieldSelector


def watches_by(audit_log: Path, user: str) -> Counter[Key]:
    """The watches ``user`` started, by what they select (the API server's own record)."""
    out: Counter[Key] = Counter()
    for line in audit_log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        if event.get("verb") != "watch" or event["user"]["username"] != user:
            continue
        uri = urlsplit(event["requestURI"])
        query = parse_qs(uri.query)
        out[(uri.path, *(query.get(k, [""])[0] for k in ("labelSelector", "fieldSelector")))] += 1
    return out


def key(selection: Selection) -> Key:
    return (selection.path, selection.label_selector, selection.field_selector)


async def test_each_resource_and_selection_is_watched_once_per_process(
    devcluster: DevCluster, namespace: str, test_id: str, sa_kubeconfig_for: KubeconfigFactory
) -> None:
    kubeconfig = await sa_kubeconfig_for(autoscaling=True)
    template = nodes.NodeTemplate(gpus=2, dra=True, labels={TEST_LABEL: test_id})
    pools = [
        {
            "name": f"{test_id}-{kind}",
            "target": {"namespace": namespace, "name": f"{test_id}-{kind}"},
            "node_selector": f"{POOL_LABEL}={test_id}-{kind}",
            "template": declared,
            "max_replicas": 2,
        }
        for kind, declared in (
            ("plugin", {"resources": {"nvidia.com/gpu": 8}, "labels": {TEST_LABEL: test_id}}),
            ("dra", {"labels": {TEST_LABEL: test_id}, "dra": resourceslices.pool_dra(template)}),
        )
    ]
    cfg = controller_config(
        kubeconfig=kubeconfig,
        namespace=namespace,
        test_id=test_id,
        endpoints={},  # found through the API: the exporters' pods are watched too
        signals={"direct": {"namespace": namespace, "label_selector": f"{TEST_LABEL}={test_id}"}},
        pools=pools,
    )
    user = f"system:serviceaccount:{namespace}:{SA}"
    async with running(cfg) as ctl:
        controller = ctl.controller
        informers = {v.informer for v in controller.views}
        if controller.caches.rules is not None:
            informers.add(controller.caches.rules.informer)

        async def all_watching() -> Counter[Key] | None:
            # Every informer of the process has started its watch, and the API server has
            # recorded as many watches from the controller as the informers started.
            started = sum(i.watches for i in informers)
            seen = watches_by(devcluster.layout.audit_log, user)
            return seen if all(i.watches for i in informers) and sum(seen.values()) >= started else None

        seen = await eventually(all_watching, what="every informer's watch recorded by the API server")
        registered = {key(i.selection) for i in controller.informers.informers}
    assert {k: n for k, n in seen.items() if n != 1} == {}, "watched more than once"
    assert set(seen) == registered
    # No cache of the fleet's pods: the autoscaler's pending pods and the exporters' are the
    # only pods watched, each by a selector.
    pods = {k for k in registered if k[0] == "/api/v1/pods"}
    assert pods == {("/api/v1/pods", "", "spec.nodeName=,status.phase=Pending")} | {
        k for k in pods if k[1] == f"{TEST_LABEL}={test_id}"
    }, pods
    # Readers share: the reconciler's and the autoscaler's ResourceClaims are one watch.
    assert ("/apis/resource.k8s.io/v1/resourceclaims", "", "") in registered

"""The Kubernetes API as the exporter uses it: credentials (the pod's service account, else a
kubeconfig), listing the pods of this node, and the node name itself."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace
from pathlib import Path

from gpumon.doctor.result import CheckResult, Status
from gpumon.kube.client import KubeClient, KubeError, error_kind
from gpumon.kube.credentials import CredentialsError, load_credentials

FAMILY = "kube-api"
NODE_NAME_FIX = (
    "set NODE_NAME from the downward API: env: [{name: NODE_NAME, valueFrom: {fieldRef: "
    "{fieldPath: spec.nodeName}}}]"
)
_FIXES = {
    "no_credentials": (
        "mount the service account token (automountServiceAccountToken: true) or set KUBECONFIG; "
        "without the API, pods are named from pod-resources only"
    ),
    "unauthorized": "the token was refused: recreate the pod so it gets a fresh service account token",
    "forbidden": "grant the exporter's service account list on pods (the chart's exporter ClusterRole)",
    "unreachable": "the API server cannot be reached: check network policies and KUBERNETES_SERVICE_HOST",
}
_DEFAULT_FIX = "read the API server's answer above; the exporter retries with backoff meanwhile"


@dataclass(frozen=True, slots=True)
class KubeFacts:
    node: str
    node_from_env: bool  # NODE_NAME (or node_name in the config) rather than the host name
    in_cluster: bool
    used: bool = True  # False when the exporter does not read the API (pods.api, pods.enabled)
    error_kind: str | None = None
    error: str | None = None
    pods_on_node: int | None = None
    more: bool = False  # the list was cut at its limit


def in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def gather(
    node: str,
    *,
    node_from_env: bool,
    timeout_seconds: float,
    used: bool = True,
    kubeconfig: Path | None = None,
) -> KubeFacts:
    """``kubeconfig`` None: the pod's service account, else $KUBECONFIG or ~/.kube/config."""
    base = KubeFacts(node, node_from_env, in_cluster(), used)
    if not used:
        return base
    return asyncio.run(_list_pods(base, timeout_seconds, kubeconfig))


async def _list_pods(base: KubeFacts, timeout_seconds: float, kubeconfig: Path | None) -> KubeFacts:
    # The exporter's own client and credential order (gpumon.kube), so what works here works
    # for the exporter and what fails fails for it too.
    try:
        credentials = load_credentials(kubeconfig=kubeconfig)
    except CredentialsError as e:
        return replace(base, error_kind="no_credentials", error=str(e))
    params = {"fieldSelector": f"spec.nodeName={base.node}", "limit": "500"}
    try:
        async with KubeClient(credentials, request_timeout=timeout_seconds, connections=1) as api:
            body = await api.get("/api/v1/pods", params)
    except KubeError as e:
        kind = "unreachable" if e.status == 0 else error_kind(e)
        return replace(base, error_kind=kind, error=e.message if e.status == 0 else str(e))
    except ValueError as e:
        return replace(base, error_kind="unreachable", error=str(e))
    more = bool((body.get("metadata") or {}).get("continue"))
    return replace(base, pods_on_node=len(body.get("items") or ()), more=more)


# ---------------------------------------------------------------------------------------------
# Judgement (pure)


def judge(facts: KubeFacts) -> list[CheckResult]:
    return [_node_name(facts), _api(facts)]


def _node_name(facts: KubeFacts) -> CheckResult:
    if facts.node_from_env:
        return CheckResult(FAMILY, "node name", Status.OK, f"{facts.node} (from NODE_NAME or the config)")
    if facts.in_cluster:
        found = f"NODE_NAME is not set: using the host name {facts.node!r}, which in a pod is the pod's name"
        return CheckResult(FAMILY, "node name", Status.FAIL, found, NODE_NAME_FIX)
    found = f"NODE_NAME is not set: using the host name {facts.node!r}"
    return CheckResult(FAMILY, "node name", Status.WARN, found, NODE_NAME_FIX)


def _api(facts: KubeFacts) -> CheckResult:
    name = "list pods on this node"
    if not facts.used:
        return CheckResult(FAMILY, name, Status.OK, "not used: the exporter does not read the API (pods.api)")
    who = "the pod's service account" if facts.in_cluster else "the kubeconfig"
    if facts.error_kind is not None:
        found = f"as {who}: {facts.error_kind}: {facts.error}"
        return CheckResult(FAMILY, name, Status.FAIL, found, _FIXES.get(facts.error_kind, _DEFAULT_FIX))
    count = f"{facts.pods_on_node}{'+' if facts.more else ''}"
    found = f"as {who}: {count} pod(s) on node {facts.node}"
    if facts.pods_on_node == 0 and facts.in_cluster:
        return CheckResult(
            FAMILY,
            name,
            Status.WARN,
            found + ", though this pod runs on a node: is the node name right?",
            NODE_NAME_FIX,
        )
    return CheckResult(FAMILY, name, Status.OK, found)

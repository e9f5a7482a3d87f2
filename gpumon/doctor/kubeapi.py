"""The Kubernetes API as the exporter uses it: credentials (the pod's service account, else a
kubeconfig), listing the pods of this node, and the node name itself."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from gpumon.doctor.result import CheckResult, Status
from gpumon.kubeclient import CredentialsError, KubeClient, from_kubeconfig, load_credentials

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
    # The exporter's own client and credential order (gpumon.kubeclient), so what works here
    # works for the exporter and what fails fails for it too.
    try:
        credentials = load_credentials() if kubeconfig is None else from_kubeconfig(kubeconfig)
    except CredentialsError as e:
        return replace(base, error_kind="no_credentials", error=str(e))
    params = {"fieldSelector": f"spec.nodeName={base.node}", "limit": "500"}
    try:
        async with (
            KubeClient(credentials) as api,
            api.get("/api/v1/pods", params, aiohttp.ClientTimeout(total=timeout_seconds)) as resp,
        ):
            if resp.status >= 400:
                kind = {401: "unauthorized", 403: "forbidden"}.get(resp.status, f"http_{resp.status}")
                text = await resp.text(errors="replace")
                return replace(base, error_kind=kind, error=_status_text(resp.status, text))
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
        return replace(base, error_kind="unreachable", error=str(e) or type(e).__name__)
    if not isinstance(body, dict):
        return replace(base, error_kind="unreachable", error="the answer to a pod list is no JSON object")
    more = bool((body.get("metadata") or {}).get("continue"))
    return replace(base, pods_on_node=len(body.get("items") or ()), more=more)


def _status_text(status: int, text: str) -> str:
    """The API server's Status object as ``403 Forbidden: <its message>``, else the raw text."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return f"{status} {doc.get('reason', '')}: {doc.get('message', '')}"
    return f"{status}: {text[:300]}"


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

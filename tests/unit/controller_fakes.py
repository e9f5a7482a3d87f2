"""Test doubles for the controller's unit tests: a recording in-memory API and verdict builders.

The fake keeps objects as JSON, applies merge patches (RFC 7386), merges status conditions by
type like a strategic merge patch, bumps resourceVersion on each write and answers 409 when a
patch carries a stale one, which is all the controller relies on.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpumon.config import HealthConfig
from gpumon.config.controller import ControllerConfig, PolicyConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.policy import Rule
from gpumon.controller.core.signals import FleetSignals, NodeReading
from gpumon.controller.core.verdicts import Finding, GpuVerdict, NodeVerdict, SignalStatus
from gpumon.controller.shell.leader import LeaderElector, LeaderSettings
from gpumon.controller.shell.lease_thread import LeaseThread
from gpumon.gpu.health import Severity
from gpumon.kube.client import Conflict, KubeError, NotFound


class StaticSource:
    """A signal source whose readings the test sets."""

    name = "static"

    def __init__(self) -> None:
        self.nodes: dict[str, NodeReading] = {}

    def current(self) -> FleetSignals:
        return FleetSignals(MappingProxyType(dict(self.nodes)))

    async def run(self, on_change: Any) -> None:
        raise AssertionError("not used")


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self._rv = 100
        # Hooks by (method, path): return a dict to answer, raise to fail, None to go on.
        self.hooks: dict[tuple[str, str], Callable[[Any], Any]] = {}
        # Collections where POST creates an object (at <collection>/<metadata.name>).
        self.creatable: set[str] = set()

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def add(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        self._bump(obj)
        self.objects[path] = obj
        return obj

    def touch(self, path: str) -> None:
        """Someone else changed the object: its resourceVersion moves on."""
        self._bump(self.objects[path])

    def writes(self, method: str | None = None) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] != "GET" and (method is None or c[0] == method)]

    def _hook(self, method: str, path: str, body: Any) -> Any:
        hook = self.hooks.get((method, path))
        return hook(body) if hook else None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.calls.append(("GET", path, params))
        answer = self._hook("GET", path, params)
        if answer is not None:
            return answer
        if path == "/api/v1/pods" and "spec.nodeName=" in (params or {}).get("fieldSelector", ""):
            return {"metadata": {}, "items": self.pods_on((params or {})["fieldSelector"].split("=", 1)[1])}
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node``, as a list by ``spec.nodeName`` answers."""
        return [
            copy.deepcopy(o)
            for p, o in self.objects.items()
            if "/pods/" in p and (o.get("spec") or {}).get("nodeName") == node
        ]

    def pod_lists(self) -> list[str]:
        """The nodes whose pods were listed, in order."""
        return [
            params["fieldSelector"].split("=", 1)[1]
            for m, p, params in self.calls
            if m == "GET"
            and p == "/api/v1/pods"
            and params
            and "spec.nodeName=" in params.get("fieldSelector", "")
        ]

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", path, copy.deepcopy(dict(body))))
        answer = self._hook("POST", path, body)
        if answer is not None:
            return answer
        if path in self.creatable:
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                raise Conflict(409, "AlreadyExists", target)
            return copy.deepcopy(self.add(target, dict(body)))
        return {"kind": "Status", "status": "Success"}

    async def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("PUT", path, copy.deepcopy(dict(body))))
        answer = self._hook("PUT", path, body)
        if answer is not None:
            return answer
        obj = copy.deepcopy(dict(body))
        current = self.objects.get(path)
        if current is not None and obj.get("metadata", {}).get("resourceVersion") not in (
            None,
            current["metadata"]["resourceVersion"],
        ):
            raise Conflict(409, "Conflict", path)
        self._bump(obj)
        self.objects[path] = obj
        return copy.deepcopy(obj)

    async def patch(self, path: str, body: Mapping[str, Any], *, strategic: bool = False) -> dict[str, Any]:
        self.calls.append(("PATCH", path, copy.deepcopy(dict(body))))
        answer = self._hook("PATCH", path, body)
        if answer is not None:
            return answer
        base = path.removesuffix("/status")
        if base not in self.objects:
            raise NotFound(404, "NotFound", path)
        obj = self.objects[base]
        if strategic:
            conds = {c["type"]: c for c in obj.setdefault("status", {}).get("conditions", [])}
            for cond in body.get("status", {}).get("conditions", []):
                conds[cond["type"]] = {**conds.get(cond["type"], {}), **cond}
            obj["status"]["conditions"] = list(conds.values())
        else:
            rv = body.get("metadata", {}).get("resourceVersion")
            if rv is not None and rv != obj["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", f"{path}: resourceVersion {rv} is stale")
            patch = copy.deepcopy(dict(body))
            patch.get("metadata", {}).pop("resourceVersion", None)
            obj = merge_patch(obj, patch)
        self._bump(obj)
        self.objects[base] = obj
        return copy.deepcopy(obj)

    async def delete(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self.calls.append(("DELETE", path, body))
        answer = self._hook("DELETE", path, body)
        if answer is not None:
            return answer
        if self.objects.pop(path, None) is None:
            raise NotFound(404, "NotFound", path)
        return {"kind": "Status", "status": "Success"}

    async def lines(
        self, path: str, params: Mapping[str, str], *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[bytes]:
        raise KubeError(501, "NotImplemented", "FakeKube does not stream")
        yield b""  # pragma: no cover


# Seconds, not the defaults' tens: the lease thread runs on the real monotonic clock.
FAST_LEASE = LeaderSettings(lease_duration_seconds=1.5, renew_deadline_seconds=0.5, retry_period_seconds=0.1)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpumon/leases"


def lease_thread(
    api: FakeKube,
    identity: str = "a",
    settings: LeaderSettings = FAST_LEASE,
    on_change: Callable[[bool], None] | None = None,
) -> LeaseThread:
    """An elector on its own thread, the way the app builds one, on ``api`` (a FakeKube is bound
    to no loop, so the thread uses it as it is)."""
    api.creatable.add(LEASES)

    def elector(thread_api: Any, on_change: Callable[[bool], None]) -> LeaderElector:
        return LeaderElector(
            thread_api,
            namespace="gpumon",
            name="gpumon-controller",
            identity=identity,
            settings=settings,
            on_change=on_change,
        )

    return LeaseThread(elector, lambda: nullcontext(api), on_change=on_change, stop_seconds=5.0)


def finding(
    rule: str = "xid-unhealthy",
    severity: Severity = Severity.UNHEALTHY,
    reason: str = "XidFatal",
    evidence: str = "Xid 79",
    at: float = 100.0,
) -> Finding:
    return Finding(rule, severity, reason, evidence, f"fix {reason}", since=at, first_bad_at=at)


def gpu_verdict(index: int = 3, *findings: Finding, recovering: bool = False) -> GpuVerdict:
    return GpuVerdict(f"GPU-{index}", index, findings or (finding(),), recovering=recovering)


def verdict(
    *gpus: GpuVerdict,
    node: str = "n1",
    signals: SignalStatus = SignalStatus.FRESH,
    node_findings: tuple[Finding, ...] = (),
) -> NodeVerdict:
    return NodeVerdict(node, signals, 1.0, gpus, node_findings)


def healthy(node: str = "n1") -> NodeVerdict:
    return NodeVerdict(node, SignalStatus.FRESH, 1.0)


def load_rules(
    *,
    inline: Sequence[Mapping[str, Any]] = (),
    rules_file: Path | None = None,
    builtin: bool = True,
    health: HealthConfig | None = None,
    default_recover_after_seconds: float = 900.0,
) -> tuple[Rule, ...]:
    """Rules the way the controller gets them: loaded with its config, then converted."""
    policy = PolicyConfig(
        rules=list(inline),
        rules_file=rules_file,
        builtin_rules=builtin,
        health=health or HealthConfig(),
        recover_after_seconds=default_recover_after_seconds,
    )
    return build_policy(ControllerConfig(policy=policy)).rules

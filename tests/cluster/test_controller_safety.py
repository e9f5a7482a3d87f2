"""The controller's safety nets on the real control plane: circuit breaker, stale signals,
dry-run, least-privilege RBAC, and a standby taking over from a leader that stops or dies."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest
from controller_harness import (  # noqa: F401 - fixtures
    POOL_LABEL,
    Running,
    Scene,
    events,
    exporters,
    fresh_signals,
    node_obj,
    our_taint,
    running,
    sa_kubeconfig_for_fixture,
    scene_fixture,
    tainted,
    wait_for_event,
)
from kubernetes_asyncio import client

from gpumon.devcluster.waiting import eventually
from gpumon.kube.client import KubeError, connected


async def _rounds_after(ctl: Running, rounds: int) -> bool | None:
    return True if ctl.controller.reconciler.rounds > rounds else None


async def _leader(ctl: Running) -> bool | None:
    return True if ctl.controller.is_leader() else None


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


async def test_breaker_three_of_five_failing_at_once_quarantines_two_and_opens(scene: Scene) -> None:
    core, namespace = scene.core, scene.namespace
    pool = f"p-{scene.test_id}"[:63]
    names = await scene.nodes(5, 2, **{POOL_LABEL: pool})
    key = f"breaker.gpumon.io/{pool}"
    async with exporters(names, gpus=2) as ex, scene.controller(ex) as ctl:
        failing = names[:3]
        for n in failing:
            ex[n].fault(gpu=0, fault="xid", code=79)

        async def breaker_open() -> client.V1ConfigMap | None:
            cm = await core.read_namespaced_config_map("gpumon-controller", namespace)
            return cm if (cm.metadata.annotations or {}).get(key) else None

        cm = await eventually(breaker_open, what="breaker recorded on the ConfigMap")
        trip = json.loads(cm.metadata.annotations[key])
        assert "3 of 5 nodes" in trip["reason"] and "limit of 2" in trip["reason"]

        async def two_tainted() -> list[str] | None:
            hit = [n for n in names if our_taint(await node_obj(core, n))]
            return hit if len(hit) == 2 else None

        quarantined = await eventually(two_tainted, what="exactly two quarantined")
        (refused,) = set(failing) - set(quarantined)
        ev = await wait_for_event(core, "default", refused, "GpuQuarantineRefused")
        assert "circuit breaker" in ev.message and pool in ev.message
        await wait_for_event(core, namespace, "gpumon-controller", "GpuBreakerOpen")
        # Open means open: the third node stays untouched on later rounds.
        before = ctl.controller.reconciler.rounds
        ctl.controller.reconciler.mark(names)
        await eventually(lambda: _rounds_after(ctl, before), what="another reconcile round")
        assert our_taint(await node_obj(core, refused)) is None
        status, metrics = await _get(ctl.url + "/metrics")
        assert status == 200 and f'gpumon_controller_breaker_open{{pool="{pool}"}} 1.0' in metrics
        # A person closes the breaker; with 2 of 5 quarantined within the window a third
        # quarantine is still over the limit, so it opens again and the node stays untouched.
        await core.patch_namespaced_config_map(
            "gpumon-controller", namespace, {"metadata": {"annotations": {key: None}}}
        )
        await eventually(breaker_open, what="the breaker open again")
        assert our_taint(await node_obj(core, refused)) is None


async def test_stale_signals_never_cause_remediation(scene: Scene) -> None:
    core = scene.core
    killed, dark = await scene.nodes(2)
    rules = [{"name": "thermal-unhealthy", "for": 2}]
    async with (
        exporters([killed, dark]) as ex,
        scene.controller(ex, signals={"stale_after_seconds": 3}, policy={"rules": rules}) as ctl,
    ):
        # A fault starts, then the exporter dies before the rule's `for` has passed.
        ex[killed].fault(gpu=0, fault="overheat", celsius=99)

        async def pending() -> bool | None:
            state = ctl.controller.reconciler._states.get(killed)
            return True if state is not None and state.targets else None

        await eventually(pending, what="the controller saw the fault (rule pending)", timeout_seconds=30)
        await ex[killed].stop()
        # The driver goes away on the other node: its exporter answers, but knows nothing.
        ex[dark].fault(fault="unavailable")
        lost = await wait_for_event(core, "default", killed, "GpuSignalsLost")
        await wait_for_event(core, "default", dark, "GpuSignalsLost")
        # The event comes stale_after (3 s) after the last data: well past the `for` (2 s).
        assert "no action" in lost.message
        for n in (killed, dark):
            assert our_taint(await node_obj(core, n)) is None
        counts = ctl.controller.reconciler.signal_counts()
        assert counts["fresh"] == 0 and counts["stale"] + counts["missing"] == 2
        assert ctl.controller.metrics.actions.labels("quarantine", "success")._value.get() == 0


async def test_dry_run_records_decisions_and_changes_nothing(scene: Scene) -> None:
    core = scene.core
    (node,) = await scene.nodes(1)
    async with exporters([node]) as ex, scene.controller(ex, dry_run=True) as ctl:
        for probe in ("/healthz", "/readyz"):
            status, text = await _get(ctl.url + probe)
            assert status == 200, (probe, text)
        ex[node].fault(gpu=3, fault="xid", code=79)
        ev = await wait_for_event(core, "default", node, "GpuQuarantined")
        assert ev.message.startswith("[dry-run] ") and ev.type == "Warning"
        n = await node_obj(core, node)
        assert our_taint(n) is None and "gpumon.io/unhealthy-gpus" not in n["metadata"].get("annotations", {})
        assert ctl.controller.metrics.actions.labels("quarantine", "dry_run")._value.get() >= 1


async def test_the_shipped_rbac_allows_what_the_controller_needs_and_nothing_more(scene: Scene) -> None:
    namespace = scene.namespace
    async with connected(scene.kubeconfig) as sa:
        await sa.get("/api/v1/nodes", {"limit": "1"})
        await sa.get("/api/v1/pods", {"limit": "1"})
        await sa.get(
            f"/api/v1/namespaces/{namespace}/configmaps", {"fieldSelector": "metadata.name=gpumon-controller"}
        )
        forbidden = [
            sa.delete("/api/v1/nodes/anything"),
            sa.delete(f"/api/v1/namespaces/{namespace}/pods/anything"),
            sa.get("/api/v1/secrets"),
            sa.get(f"/api/v1/namespaces/{namespace}/configmaps/other"),
            sa.post("/api/v1/namespaces/default/configmaps", {"metadata": {"name": "x"}}),
        ]
        for call in forbidden:
            with pytest.raises(KubeError) as e:
                await call
            assert e.value.status == 403, e.value


async def test_a_standby_takes_over_when_the_leader_stops_without_double_actions(scene: Scene) -> None:
    core = scene.core
    first, second = await scene.nodes(2)
    async with exporters([first, second]) as ex, scene.controller(ex, identity="a") as a:
        await eventually(lambda: _leader(a), what="a leads")
        async with scene.controller(ex, identity="b") as b:
            assert not b.controller.is_leader()
            ex[first].fault(gpu=0, fault="xid", code=79)
            await eventually(lambda: tainted(core, first), what="quarantined by the leader")
            await a.stop()  # a clean stop hands the lease over
            await eventually(lambda: _leader(b), what="b takes over", timeout_seconds=10)
            lease = await client.CoordinationV1Api(scene.api).read_namespaced_lease(
                "gpumon-controller", scene.namespace
            )
            assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions >= 1
            ex[second].fault(gpu=1, fault="xid", code=79)
            await eventually(lambda: tainted(core, second), what="quarantined by the new leader")
            # b re-examined the first node when it took over and found nothing to do.
            assert len(await events(core, "default", first, "GpuQuarantined")) == 1
            assert b.controller.metrics.actions.labels("quarantine", "success")._value.get() == 1


async def test_a_standby_takes_over_from_a_crashed_leader_within_the_lease_duration(scene: Scene) -> None:
    (node,) = await scene.nodes(1)
    async with exporters([node]) as ex, scene.controller(ex, identity="a") as a:
        await eventually(lambda: _leader(a), what="a leads")
        async with scene.controller(ex, identity="b") as b:
            await a.crash()
            crashed = time.monotonic()
            await eventually(lambda: _leader(b), what="b takes over", timeout_seconds=30)
            took = time.monotonic() - crashed
            lease_duration = b.controller.config.leader.lease_duration_seconds
            # Not before a's lease could have run out (b counts from its own sighting of a's
            # last renewal, at most one retry period before the crash), and not much after.
            assert lease_duration - 1.5 <= took <= lease_duration + 3, took
            ex[node].fault(gpu=0, fault="xid", code=79)
            await eventually(lambda: tainted(scene.core, node), what="the new leader acts")


async def test_controller_reads_prometheus_fleet_wide_when_configured(scene: Scene) -> None:
    """No Prometheus here: the source reports itself down and nothing is done (fail safe)."""
    (node,) = await scene.nodes(1)
    config = scene.config({}, signals={"source": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"}})
    async with running(config) as ctl:

        async def failed_round() -> bool | None:
            return True if ctl.controller.metrics.signal_rounds.labels("failure")._value.get() >= 1 else None

        await eventually(failed_round, what="a failed Prometheus round")
        assert ctl.controller.reconciler.signal_counts() == {"fresh": 0, "stale": 0, "missing": 1}
        assert our_taint(await node_obj(scene.core, node)) is None

"""Per-pod GPU attribution: which container uses which GPU, how much, against what it was given.

Three sources, combined here (docs/pod-attribution.md):

- kubelet pod-resources (:mod:`podresources_client`): whole devices per container, and the
  devices of its DRA claims, which this node's ResourceSlices (:mod:`dra_slices`) name;
- ``<host proc>/<pid>/cgroup`` (:mod:`process_pods`): the container of each GPU process;
- this node's pods from the API (:mod:`pod_metadata`): names for UIDs and container IDs, and
  the shared-GPU allocations of their annotations and limits (:mod:`sharing`).

Pure core: :func:`build_view` when a slow source changes, :func:`resolve_grants` when the view
or the set of GPUs changes, :func:`usages` on every tick. Shell: :class:`PodAttribution`, the
sampler's :class:`~gpumon.exporter.sources.PodAttributor`, whose ``attribute`` does dict
lookups only and whose ``refresh`` does all I/O on the slow cadence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpumon.config import PodsConfig
from gpumon.exporter.attribution_metrics import AttributionMetrics, SourceState
from gpumon.exporter.cgroups import ContainerKey
from gpumon.exporter.dra_slices import ResourceSliceWatch
from gpumon.exporter.pod_metadata import PodMeta, pod_watch
from gpumon.exporter.podresources_client import (
    Assignment,
    DeviceAssignment,
    PodKey,
    PodResourcesClient,
    PodResourcesView,
)
from gpumon.exporter.process_pods import ProcessPods
from gpumon.gpu.model import GpuIdentity, GpuSample, MigInstance, PodGpuUsage, PodRef, ProcessSample
from gpumon.k8s import sharing
from gpumon.k8s.dra import MIG_TYPE, ClaimDevice, DeviceRef, SliceDevice
from gpumon.kube.client import KubeApi, KubeClient
from gpumon.kube.credentials import CredentialsError, load_credentials
from gpumon.kube.informer import View
from gpumon.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Grant:
    """One GPU given to one container, as a source names it (UUID, index, MIG or time-sliced ID)."""

    ref: PodRef
    device: str
    # pod-resources resource name, or the DRA driver of a claim device; None for sharing schemes
    resource: str | None = None
    memory_bytes: int | None = None
    core_ratio: float | None = None
    claim: ClaimDevice | None = None  # the DRA claim device this grant is
    # The card a MIG device is carved from, as the ResourceSlice says: the device counts for
    # its card while NVML does not list the instance (yet).
    card: str | None = None


@dataclass(frozen=True, slots=True)
class AttributionView:
    by_container_id: Mapping[str, PodRef] = field(default_factory=dict)
    # Pod-level fallback for processes whose container ID is not (yet) in the pod's status.
    by_pod_uid: Mapping[str, PodRef] = field(default_factory=dict)
    grants: tuple[Grant, ...] = ()
    # Pods whose allocations are known in full, so that GPU use outside them can be flagged.
    authoritative: frozenset[PodKey] = frozenset()
    # Claim devices no ResourceSlice of this node names (yet), by container.
    unresolved: frozenset[tuple[PodRef, ClaimDevice]] = frozenset()


@dataclass(frozen=True, slots=True)
class Allocation:
    """Everything granted to one container on one GPU."""

    memory_bytes: int | None
    core_ratio: float | None
    resources: tuple[str, ...]
    claims: tuple[ClaimDevice, ...] = ()


SeriesKey = tuple[PodRef, int, MigInstance | None]
"""(container, GPU index, the MIG device on that GPU or None for the whole card)."""


def build_view(
    pods: Mapping[str, PodMeta],
    shared: Mapping[str, sharing.SharingResult],
    pod_resources: PodResourcesView | None,
    pod_resources_fresh: bool,
    slices: Mapping[DeviceRef, SliceDevice] | None = None,
) -> AttributionView:
    """Combine the slow sources. Sharing annotations, where a pod has them, define its GPUs: the
    sharing schemes' device plugins hand the kubelet virtual device IDs. A fresh pod-resources
    view also says which pods the kubelet still runs; API pods missing from it hold nothing.
    DRA claim devices are what ``slices`` says they are; one it does not name is left
    unresolved, and its pod's allocations are not known in full until it is."""
    by_cid: dict[str, PodRef] = {}
    by_uid: dict[str, PodRef] = {}
    grants: list[Grant] = []
    authoritative: set[PodKey] = set()
    unresolved: set[tuple[PodRef, ClaimDevice]] = set()
    slices = slices or {}

    def add_pod_resources(key: PodKey, uid: str, containers: Mapping[str, tuple[Assignment, ...]]) -> None:
        before = len(unresolved)
        grants.extend(_device_grants(key, uid, containers, slices, unresolved))
        if pod_resources_fresh and len(unresolved) == before:
            authoritative.add(key)

    running = pod_resources.keys() if pod_resources is not None and pod_resources_fresh else None
    named: set[PodKey] = set()
    for pod in pods.values():
        key = (pod.namespace, pod.name)
        named.add(key)
        for cid, cname in pod.container_ids.items():
            by_cid[cid] = PodRef(pod.namespace, pod.name, cname, pod.uid)
        only = pod.containers[0].name if len(pod.containers) == 1 else ""
        by_uid[pod.uid] = PodRef(pod.namespace, pod.name, only, pod.uid)
        if pod.mirror_uid:
            by_uid[pod.mirror_uid] = by_uid[pod.uid]
        if running is not None and key not in running:
            continue
        result = shared.get(pod.uid)
        if result is not None and result.allocations:
            authoritative.add(key)
            grants.extend(
                Grant(
                    PodRef(pod.namespace, pod.name, a.container, pod.uid),
                    a.gpu_uuid if a.gpu_uuid is not None else str(a.gpu_index),
                    memory_bytes=a.memory_bytes,
                    core_ratio=a.core_ratio,
                )
                for a in result.allocations
            )
        elif pod_resources is not None and key in pod_resources:
            add_pod_resources(key, pod.uid, pod_resources[key])
    # Pods the API has not told us about (API down or disabled, e.g. on Windows) still have
    # names in pod-resources, though no UID.
    for key, containers in (pod_resources or {}).items():
        if key not in named:
            add_pod_resources(key, "", containers)
    return AttributionView(by_cid, by_uid, tuple(grants), frozenset(authoritative), frozenset(unresolved))


def _device_grants(
    key: PodKey,
    uid: str,
    containers: Mapping[str, tuple[Assignment, ...]],
    slices: Mapping[DeviceRef, SliceDevice],
    unresolved: set[tuple[PodRef, ClaimDevice]],
) -> Iterable[Grant]:
    for cname, assignments in containers.items():
        ref = PodRef(key[0], key[1], cname, uid)
        for a in assignments:
            if isinstance(a, DeviceAssignment):
                for device in a.device_ids:
                    yield Grant(ref, device, a.resource)
                continue
            found = slices.get(a.device)
            if found is None or found.uuid is None:
                unresolved.add((ref, a))
                continue
            card = found.parent_uuid if found.kind == MIG_TYPE else None
            yield Grant(ref, found.uuid, a.device.driver, claim=a, card=card)


Device = tuple[GpuIdentity, MigInstance | None]
"""A card, or one MIG device on it (its identity: memory None)."""


def _mig_identity(m: MigInstance) -> MigInstance:
    return replace(m, memory=None) if m.memory is not None else m


def device_table(gpus: Sequence[GpuSample]) -> dict[str, Device]:
    """Every name a device plugin may give a device: a card's UUID and index; a MIG device's
    UUID and the old drivers' ``GPU-<uuid>/<gi>/<ci>`` (its ``MIG-`` prefix removed)."""
    table: dict[str, Device] = {}
    for g in gpus:
        ident = g.identity
        table[ident.uuid] = table[str(ident.index)] = (ident, None)
        for mig in g.slow.mig_instances if g.slow is not None else ():
            device = (ident, _mig_identity(mig))
            table[mig.uuid] = table[f"{ident.uuid}/{mig.gpu_instance}/{mig.compute_instance}"] = device
    return table


def find_device(device: str, table: Mapping[str, Device]) -> Device | None:
    # Time-slicing replicas are "<uuid>::<n>"; MIG devices of old drivers "MIG-GPU-<uuid>/<gi>/<ci>",
    # which name the parent card when its instance is not (yet) known.
    name = device.split("::", 1)[0]
    if name.startswith("MIG-GPU-"):
        name = name.removeprefix("MIG-")
        return table.get(name) or table.get(name.split("/", 1)[0])
    return table.get(name)


def resolve_grants(
    grants: Iterable[Grant], gpus: Sequence[GpuSample]
) -> tuple[dict[SeriesKey, Allocation], list[Grant]]:
    """Grants per (container, GPU index, MIG device), merged; and the grants naming no device of
    this node."""
    table = device_table(gpus)
    merged: dict[SeriesKey, Allocation] = {}
    unknown = []
    for g in grants:
        found = find_device(g.device, table)
        if found is None and g.card is not None:
            found = find_device(g.card, table)
        if found is None:
            unknown.append(g)
            continue
        key = (g.ref, found[0].index, found[1])
        prev = merged.get(key)
        resources = (g.resource,) if g.resource else ()
        claims = (g.claim,) if g.claim else ()
        if prev is None:
            merged[key] = Allocation(g.memory_bytes, g.core_ratio, resources, claims)
        else:
            # One series per device, however many sources and claims give it to the container.
            merged[key] = Allocation(
                _add(prev.memory_bytes, g.memory_bytes),
                _add(prev.core_ratio, g.core_ratio),
                tuple(sorted(set(prev.resources) | set(resources))),
                tuple(sorted(set(prev.claims) | set(claims))),
            )
    return merged, unknown


def grant_source(g: Grant) -> str:
    """The error-metric source a grant came from."""
    return "dra" if g.claim is not None else "pod_resources" if g.resource else "annotations"


_N = TypeVar("_N", int, float)


def _add(a: _N | None, b: _N | None) -> _N | None:
    return b if a is None else a if b is None else a + b


Lookup = Callable[[int], ContainerKey | None]


@dataclass(slots=True)
class _Use:
    memory_bytes: int | None = None
    sm_ratio: float = 0.0


def _process_mig(g: GpuSample, p: ProcessSample) -> MigInstance | None:
    """The MIG device a process runs in, by NVML's instance IDs; None on a card without MIG."""
    if p.gpu_instance is None or g.slow is None:
        return None
    same_gi = [m for m in g.slow.mig_instances if m.gpu_instance == p.gpu_instance]
    exact = [m for m in same_gi if m.compute_instance == p.compute_instance]
    found = exact or same_gi
    return _mig_identity(found[0]) if found else None


def card_shares(raw: Mapping[SeriesKey, float], card: Mapping[int, float | None]) -> dict[SeriesKey, float]:
    """Per-container SM ratios scaled so that a card's containers add up to at most the card's
    measured use (1.0 when the card reports none). NVML's per-process samples of concurrent
    processes cover overlapping windows, so their raw sum can exceed the card: scaling keeps
    each container's share of what was measured."""
    totals: dict[int, float] = {}
    for (_, index, _), v in raw.items():
        totals[index] = totals.get(index, 0.0) + v
    out = {}
    for key, v in raw.items():
        index = key[1]
        measured = card.get(index)
        limit = 1.0 if measured is None else min(max(measured, 0.0), 1.0)
        total = totals[index]
        out[key] = v * limit / total if total > limit else v
    return out


def usages(
    gpus: Sequence[GpuSample],
    lookup: Lookup | None,
    view: AttributionView,
    allocations: Mapping[SeriesKey, Allocation],
) -> list[PodGpuUsage]:
    """One tick: every container's use of every GPU (or MIG device), with what it was allocated
    there.

    Memory is the sum of the container's processes; SM utilization the sum of their samples,
    scaled by :func:`card_shares` so that a card's containers never add up to more than the card.
    A process in a MIG instance counts for that MIG device. An allocated container without
    processes shows 0 when processes are visible at all (``lookup`` given, GPU answered),
    nothing otherwise."""
    used: dict[SeriesKey, _Use] = {}
    measured: set[int] = set()
    sampled: set[int] = set()
    card_util: dict[int, float | None] = {}
    uuids = {g.identity.index: g.identity.uuid for g in gpus}
    if lookup is not None:
        for g in gpus:
            if g.fast is None or g.lost:
                continue
            index = g.identity.index
            measured.add(index)
            card_util[index] = g.fast.utilization_ratio
            for p in g.fast.processes:
                if p.sm_utilization_ratio is not None:
                    sampled.add(index)
                container = lookup(p.pid)
                if container is None:
                    continue
                ref = view.by_container_id.get(container.container_id) or view.by_pod_uid.get(
                    container.pod_uid
                )
                if ref is None:
                    continue
                acc = used.setdefault((ref, index, _process_mig(g, p)), _Use())
                acc.memory_bytes = _add(acc.memory_bytes, p.used_memory_bytes)
                acc.sm_ratio += p.sm_utilization_ratio or 0.0
    shares = card_shares({k: u.sm_ratio for k, u in used.items() if k[1] in sampled}, card_util)
    out = []
    for key in used.keys() | allocations.keys():
        ref, index, mig = key
        if index not in uuids:
            continue
        alloc = allocations.get(key)
        use = used.get(key)
        memory: int | None
        util: float | None
        if use is not None:
            memory, util = use.memory_bytes, shares.get(key)
        elif index in measured:
            memory, util = 0, 0.0
        else:
            memory, util = None, None
        out.append(
            PodGpuUsage(
                ref=ref,
                gpu_index=index,
                gpu_uuid=uuids[index],
                used_memory_bytes=memory,
                utilization_ratio=util,
                allocated_memory_bytes=alloc.memory_bytes if alloc else None,
                allocated_core_ratio=alloc.core_ratio if alloc else None,
                allocated_resources=alloc.resources if alloc else (),
                unallocated=use is not None
                and alloc is None
                and (ref.namespace, ref.pod) in view.authoritative,
                mig=mig,
                claims=alloc.claims if alloc else (),
            )
        )
    return out


def cap(series: list[PodGpuUsage], limit: int) -> tuple[list[PodGpuUsage], list[PodGpuUsage]]:
    """At most ``limit`` series, those with processes first, in a stable order; and the rest."""
    series.sort(
        key=lambda u: (
            not u.used_memory_bytes and not u.utilization_ratio,
            u.ref.namespace,
            u.ref.pod,
            u.ref.container,
            u.gpu_index,
            u.device_uuid,
        )
    )
    return series[:limit], series[limit:]


def _gpu_signature(gpus: Sequence[GpuSample]) -> tuple[object, ...]:
    return tuple(
        (g.identity.index, g.identity.uuid, tuple(m.uuid for m in g.slow.mig_instances) if g.slow else ())
        for g in gpus
    )


class PodAttribution:
    """The sampler's pod attributor. Sources that are None are disabled or unsupported; their
    state in the metrics says which."""

    def __init__(
        self,
        config: PodsConfig,
        metrics: AttributionMetrics,
        *,
        pod_resources: PodResourcesClient | None,
        pods: View[PodMeta] | None,
        processes: ProcessPods | None,
        call_timeout_seconds: float,
        initial_states: Mapping[str, SourceState],
        pods_api: KubeApi | None = None,
        slices: ResourceSliceWatch | None = None,
    ) -> None:
        self._config = config
        self.metrics = metrics
        self._pod_resources = pod_resources
        self._pods = pods
        self._slices = slices
        # Where and with what the slice watch starts, once a DRA claim shows up; None outside
        # lifespan, or without an API client.
        self._slices_launch: tuple[contextlib.AsyncExitStack, KubeApi] | None = None
        self._slices_needed = False
        self._reported_unresolved: frozenset[tuple[PodRef, ClaimDevice]] = frozenset()
        self._processes = processes
        self._timeout = call_timeout_seconds
        self._unit_bytes = sharing.MEMORY_UNITS[config.gpushare_memory_unit]
        self._shared: dict[str, tuple[PodMeta, sharing.SharingResult]] = {}
        self._view = AttributionView()
        self._view_inputs: tuple[object, ...] = ()
        self._resolved_for: tuple[AttributionView, tuple[object, ...]] | None = None
        self._allocations: dict[SeriesKey, Allocation] = {}
        self._dropped: set[SeriesKey] = set()
        self._resolving: asyncio.Future[None] | None = None
        self._pods_api = pods_api
        metrics.states.update(initial_states)

    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """Runs the pod watch while the exporter runs (and the ResourceSlice watch from the first
        DRA claim on), and closes every source after; an aiohttp ``cleanup_ctx`` (put it before
        the sampler's, so that it stops after the sampler)."""
        async with contextlib.AsyncExitStack() as stack:
            api = None
            if self._pods is not None or self._slices is not None:
                api = self._pods_api or await _api_client(stack, self.metrics)
            if self._pods is not None and api is not None:
                task = asyncio.create_task(self._pods.informer.run(api), name="gpumon-pod-watch")
                stack.push_async_callback(_cancel, task)
            if self._slices is not None and api is not None:
                self._slices_launch = (stack, api)
            try:
                yield
            finally:
                self._slices_launch = None

    running = contextlib.asynccontextmanager(lifespan)

    async def refresh(self) -> None:
        try:
            if self._pod_resources is not None:
                await self._pod_resources.poll()
                self._start_slices(self._pod_resources.view)
            if self._processes is not None:
                await self._resolve_processes(self._processes)
            self._rebuild()
        except Exception:  # the PodAttributor contract: never raise, keep the last view
            log.exception("pod attribution refresh failed")
            self.metrics.error("attribution", "internal")
        self._update_states()

    def _start_slices(self, view: PodResourcesView | None) -> None:
        """Starts the ResourceSlice watch the first time a container holds a DRA claim device: a
        node without DRA pods never lists slices."""
        if self._slices is None or self._slices_needed or view is None:
            return
        if not any(isinstance(a, ClaimDevice) for c in view.values() for held in c.values() for a in held):
            return
        self._slices_needed = True
        if self._slices_launch is None:
            return  # no API client: the claims stay unresolved, the state says so
        stack, api = self._slices_launch
        task = asyncio.create_task(self._slices.view.informer.run(api), name="gpumon-resourceslice-watch")
        stack.push_async_callback(_cancel, task)

    async def _resolve_processes(self, processes: ProcessPods) -> None:
        if self._resolving is not None and not self._resolving.done():
            self.metrics.error("proc", "busy")  # the previous pass is still stuck in /proc
            return
        self._resolving = asyncio.ensure_future(asyncio.to_thread(processes.resolve))
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.shield(self._resolving)
        except TimeoutError:
            self.metrics.error("proc", "timeout")

    def _rebuild(self) -> None:
        pods = self._pods.items() if self._pods is not None else {}
        pr = self._pod_resources
        # The pod-resources view is compared by content: each poll builds a new one.
        inputs = (
            self._pods.generation if self._pods is not None else None,
            pr.view if pr is not None else None,
            pr.fresh if pr is not None else None,
            self._slices.view.generation if self._slices is not None else None,
            self._slices.view.synced.is_set() if self._slices is not None else None,
        )
        if inputs == self._view_inputs:
            return
        self._view_inputs = inputs
        shared: dict[str, tuple[PodMeta, sharing.SharingResult]] = {}
        for uid, pod in pods.items():
            cached = self._shared.get(uid)
            if cached is not None and cached[0] == pod:
                shared[uid] = cached
                continue
            result = sharing.shared_allocations(
                pod.annotations, pod.init_containers, pod.containers, gpushare_unit_bytes=self._unit_bytes
            )
            for problem in result.problems:  # once per change of the pod, not per refresh
                self.metrics.error("annotations", problem)
            shared[uid] = (pod, result)
        self._shared = shared
        self._view = build_view(
            pods,
            {uid: r for uid, (_, r) in shared.items()},
            pr.view if pr is not None else None,
            pr.fresh if pr is not None else False,
            self._slices.index if self._slices is not None else None,
        )
        self._report_unresolved(self._view.unresolved)

    def _report_unresolved(self, unresolved: frozenset[tuple[PodRef, ClaimDevice]]) -> None:
        """Counts each claim device once when it becomes unresolved, once the slices are listed:
        before that, every claim device is merely not looked up yet."""
        self.metrics.dra_unresolved = len(unresolved)
        if self._slices is None or not self._slices.view.synced.is_set():
            return
        for _ in unresolved - self._reported_unresolved:
            self.metrics.error("dra", "unknown_device")
        self._reported_unresolved = unresolved

    def _update_states(self) -> None:
        states = self.metrics.states
        if self._pod_resources is not None:
            states["pod_resources"] = SourceState.UP if self._pod_resources.fresh else SourceState.DOWN
        if self._pods is not None:
            states["api"] = SourceState.UP if self._pods.informer.up else SourceState.DOWN
        if self._slices is not None and self._slices_needed:
            states["dra"] = (
                SourceState.UP
                if self._slices.view.informer.up
                else SourceState.UNSUPPORTED
                if self._slices.view.informer.failure == "not_found"  # resource.k8s.io/v1 not served
                else SourceState.DOWN
            )

    def attribute(self, gpus: Sequence[GpuSample]) -> tuple[PodGpuUsage, ...]:
        view = self._view
        signature = _gpu_signature(gpus)
        last = self._resolved_for
        if last is None or last[0] is not view or last[1] != signature:
            self._allocations, unknown = resolve_grants(view.grants, gpus)
            for g in unknown:
                self.metrics.error(grant_source(g), "unknown_device")
            self._resolved_for = (view, signature)
        lookup = self._processes.lookup if self._processes is not None else None
        series = usages(gpus, lookup, view, self._allocations)
        kept, dropped = cap(series, self._config.max_series)
        dropped_keys = {(u.ref, u.gpu_index, u.mig) for u in dropped}
        self.metrics.dropped_total += len(dropped_keys - self._dropped)
        self._dropped = dropped_keys
        self.metrics.series = len(kept)
        return tuple(kept)


def _process_source(
    config: PodsConfig, metrics: AttributionMetrics
) -> tuple[ProcessPods | None, SourceState]:
    if sys.platform == "win32":
        return None, SourceState.UNSUPPORTED
    if not config.host_proc.is_dir():
        log.warning("no proc filesystem at %s: per-process attribution is off", config.host_proc)
        metrics.error("proc", "host_proc_missing")
        return None, SourceState.DOWN
    return ProcessPods(config.host_proc, metrics.error), SourceState.UP


def watched_resource(config: PodsConfig) -> Callable[[str], bool]:
    names = frozenset(config.resource_names)
    prefixes = tuple(config.resource_prefixes)
    return lambda resource: resource in names or resource.startswith(prefixes)


def build_attribution(
    config: PodsConfig,
    node: str,
    *,
    call_timeout_seconds: float,
    pods_api: KubeApi | None = None,
) -> PodAttribution:
    """The attributor and its sources, not started: run :meth:`PodAttribution.lifespan` (an
    aiohttp ``cleanup_ctx``) around its use. Without ``pods_api`` (a client the caller owns),
    a :class:`~gpumon.kube.client.KubeClient` is made from the pod's service account, else the
    kubeconfig."""
    metrics = AttributionMetrics()
    processes, proc_state = _process_source(config, metrics)
    # DRA claim devices are named through the API's ResourceSlices: without the API, none.
    dra_drivers = frozenset(config.dra_drivers) if config.api else frozenset()
    initial_states = {
        "proc": proc_state,
        "pod_resources": SourceState.DOWN,
        "api": SourceState.DOWN if config.api else SourceState.DISABLED,
    }
    if not dra_drivers:
        initial_states["dra"] = SourceState.DISABLED
    return PodAttribution(
        config,
        metrics,
        pod_resources=PodResourcesClient(
            config.pod_resources_socket,
            metrics.error,
            watched_resource(config),
            timeout_seconds=call_timeout_seconds,
            dra_drivers=dra_drivers,
        ),
        pods=pod_watch(node, metrics.error) if config.api else None,
        processes=processes,
        call_timeout_seconds=call_timeout_seconds,
        initial_states=initial_states,
        pods_api=pods_api,
        slices=ResourceSliceWatch(node, dra_drivers, metrics.error) if dra_drivers else None,
    )


async def _api_client(stack: contextlib.AsyncExitStack, metrics: AttributionMetrics) -> KubeApi | None:
    try:
        credentials = load_credentials()
    except CredentialsError as e:
        log.warning("no Kubernetes credentials; pod names come from pod-resources only: %s", e)
        metrics.error("api", "no_credentials")
        return None
    return await stack.enter_async_context(KubeClient(credentials, connections=4))


async def _cancel(task: asyncio.Task[None]) -> None:
    await cancel_and_wait([task])

"""Wire schema v1: ``/api/v1/snapshot`` and every ``/api/v1/watch`` line (docs/exporter.md).

Choices, and why:

- **Versioned.** Every document and line carries ``"schema": 1``; a reader refuses any other
  value (and a missing one) instead of guessing. Within v1 only optional fields are added.
- **Unknown fields are ignored** (``extra="ignore"``), so a newer exporter may add an optional
  field without breaking an older controller during a rolling upgrade; a change that an old
  reader would misread gets a new schema version.
- **Strict types.** ``strict=True``: ``"79"`` is not an int and ``true`` is not a number. Numbers
  travel as numbers (temperature, ECC counts, row-remap flags, lost, Xid codes with their
  times); nothing here is meant to be parsed back out of a human ``detail`` string.
- **Bounded.** A watch line is at most :data:`MAX_LINE_BYTES`, a snapshot
  :data:`MAX_DOCUMENT_BYTES`; at most :data:`MAX_GPUS` GPUs, :data:`MAX_PODS` pod entries per
  node and :data:`MAX_XIDS_PER_GPU` Xid codes per GPU. Readers reject anything larger with a
  :class:`WireError` naming the kind, which they count; writers truncate the collections that
  can legitimately grow (pods, processes, Xid codes) so they never send what a reader refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gpumon.devices.model import (
    DriverInfo,
    FastFields,
    GpuIdentity,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    MemoryInfo,
    MigInstance,
    PodGpuUsage,
    PodRef,
    ProcessSample,
    RecoveryAction,
    SlowFields,
    Snapshot,
    XidEvent,
)

SCHEMA_VERSION: Final = 1

MAX_LINE_BYTES: Final = 4 << 20
MAX_DOCUMENT_BYTES: Final = 16 << 20
MAX_GPUS: Final = 64
# The exporter's default pods.max_series: a node with more pod entries is truncated.
MAX_PODS: Final = 4096
MAX_XIDS_PER_GPU: Final = 64
MAX_REASONS: Final = 32
MAX_PROCESSES: Final = 1024
MAX_MIG_INSTANCES: Final = 64
MAX_TEXT: Final = 4096


class WireError(ValueError):
    """Input refused at the edge. ``kind`` is a short label for counting: ``oversize`` (too many
    bytes), ``schema`` (another or no schema version) or ``invalid`` (not JSON, wrong types,
    too many items)."""

    def __init__(self, kind: Literal["oversize", "schema", "invalid"], detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class _WireModel(BaseModel):
    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", validate_by_name=True, serialize_by_alias=True
    )


Text = Annotated[str, Field(max_length=MAX_TEXT)]
Count = Annotated[int, Field(ge=0)]
Index = Annotated[int, Field(ge=0, lt=1 << 16)]
Number = Annotated[float, Field(allow_inf_nan=False)]


# ---------------------------------------------------------------------------------------------
# Shared parts


class Reason(_WireModel):
    code: Text
    detail: Text  # for people only
    state: HealthState


class Verdict(_WireModel):
    """The exporter's own judgement, for display: the controller applies its own rules."""

    state: HealthState
    reasons: tuple[Reason, ...] = Field(default=(), max_length=MAX_REASONS)


class Xid(_WireModel):
    """One Xid code on one GPU: when it was last seen (the device backend's timestamp, Unix
    seconds) and how often since the exporter started."""

    code: Count
    at: Number
    count: Annotated[int, Field(ge=1)] = 1


class Pod(_WireModel):
    namespace: Text
    pod: Text
    container: Text
    uid: Text = ""


# ---------------------------------------------------------------------------------------------
# /api/v1/watch


class GpuStatus(_WireModel):
    """One GPU as a watch line tells it: every number the controller's rules read, the Xid
    codes with their times, the pods on the GPU, and the exporter's verdict."""

    gpu: Index
    uuid: Text
    health: Verdict
    temperature_celsius: Number | None = None
    ecc_uncorrected: Count | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    # NVML's number; None where the driver does not report it.
    recovery_action: RecoveryAction | None = None
    lost: bool = False
    xids: tuple[Xid, ...] = Field(default=(), max_length=MAX_XIDS_PER_GPU)
    pods: tuple[Pod, ...] = Field(default=(), max_length=MAX_PODS)


def _pods_bounded(gpus: Iterable[GpuStatus]) -> None:
    if sum(len(g.pods) for g in gpus) > MAX_PODS:
        raise ValueError(f"more than {MAX_PODS} pod entries")


class _Line(_WireModel):
    schema_version: Literal[1] = Field(alias="schema")
    node: Text
    time: Number


class StateLine(_Line):
    """Every GPU: the first line of a stream, and again after the client fell behind."""

    type: Literal["state"] = "state"
    backend_up: bool
    gpus: tuple[GpuStatus, ...] = Field(max_length=MAX_GPUS)

    @model_validator(mode="after")
    def _bounded(self) -> StateLine:
        _pods_bounded(self.gpus)
        return self


class HealthLine(_Line):
    """One GPU changed: its verdict, a number, an Xid, or the pods on it."""

    type: Literal["health"] = "health"
    previous: HealthState | None  # None: a GPU seen for the first time
    gpu: GpuStatus


class BackendLine(_Line):
    type: Literal["backend"] = "backend"
    up: bool


class HeartbeatLine(_Line):
    type: Literal["heartbeat"] = "heartbeat"


WatchLine = Annotated[StateLine | HealthLine | BackendLine | HeartbeatLine, Field(discriminator="type")]
_WATCH_LINE: TypeAdapter[WatchLine] = TypeAdapter(WatchLine)


# ---------------------------------------------------------------------------------------------
# /api/v1/snapshot


class Identity(_WireModel):
    index: Index
    uuid: Text
    model: Text
    pci_bus_id: Text
    serial: Text | None = None
    mig_mode: bool | None = None


class Memory(_WireModel):
    total_bytes: Count
    used_bytes: Count
    free_bytes: Count
    reserved_bytes: Count | None = None


class Process(_WireModel):
    pid: Count
    used_memory_bytes: Count | None
    sm_utilization_ratio: Number | None = None
    memory_utilization_ratio: Number | None = None
    name: Text | None = None


class Fast(_WireModel):
    memory: Memory | None = None
    utilization_ratio: Number | None = None
    memory_utilization_ratio: Number | None = None
    temperature_gpu_celsius: Number | None = None
    temperature_memory_celsius: Number | None = None
    power_watts: Number | None = None
    power_limit_watts: Number | None = None
    energy_joules: Number | None = None
    sm_clock_hertz: Number | None = None
    memory_clock_hertz: Number | None = None
    throttle_reasons: tuple[Text, ...] | None = Field(default=None, max_length=64)
    processes: tuple[Process, ...] = Field(default=(), max_length=MAX_PROCESSES)


class Mig(_WireModel):
    gpu_instance: Count
    compute_instance: Count
    profile: Text
    uuid: Text
    memory: Memory | None = None


class Slow(_WireModel):
    pcie_replays: Count | None = None
    ecc_corrected: Count | None = None
    ecc_uncorrected: Count | None = None
    remapped_rows_correctable: Count | None = None
    remapped_rows_uncorrectable: Count | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    mig_instances: tuple[Mig, ...] = Field(default=(), max_length=MAX_MIG_INSTANCES)
    recovery_action: RecoveryAction | None = None


class Driver(_WireModel):
    driver_version: Text
    cuda_version: Text
    nvml_version: Text = ""


class GpuDoc(_WireModel):
    identity: Identity
    fast: Fast | None
    slow: Slow | None
    health: Verdict
    sampled_at: Number  # Unix time of the last good fast read; 0: never read
    lost: bool = False
    last_xid: Count | None = None
    xids: tuple[Xid, ...] = Field(default=(), max_length=MAX_XIDS_PER_GPU)


class PodUsage(_WireModel):
    ref: Pod
    gpu_index: Index
    gpu_uuid: Text
    used_memory_bytes: Count | None = None
    utilization_ratio: Number | None = None
    allocated_memory_bytes: Count | None = None
    allocated_core_ratio: Number | None = None
    allocated_resources: tuple[Text, ...] = Field(default=(), max_length=64)
    unallocated: bool = False
    mig: Mig | None = None  # the MIG device on the card gpu_uuid names, when it is one


class SnapshotDoc(_WireModel):
    schema_version: Literal[1] = Field(alias="schema")
    node: Text
    driver: Driver | None
    gpus: tuple[GpuDoc, ...] = Field(max_length=MAX_GPUS)
    pods: tuple[PodUsage, ...] = Field(max_length=MAX_PODS)
    taken_at: Number
    backend_up: bool
    complete: bool


# ---------------------------------------------------------------------------------------------
# Reading (the controller, status, doctor)


def _refused(e: ValidationError) -> WireError:
    errors = e.errors(include_url=False)
    kind: Literal["schema", "invalid"] = (
        "schema" if any(err["loc"] and err["loc"][-1] == "schema" for err in errors) else "invalid"
    )
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"])
    return WireError(kind, f"{where}: {first['msg']} ({len(errors)} error(s))")


def parse_watch_line(raw: bytes) -> WatchLine:
    """One line of ``/api/v1/watch``; :class:`WireError` for anything else."""
    if len(raw) > MAX_LINE_BYTES:
        raise WireError("oversize", f"a watch line of {len(raw)} bytes (limit {MAX_LINE_BYTES})")
    try:
        return _WATCH_LINE.validate_json(raw)
    except ValidationError as e:
        raise _refused(e) from None


def parse_snapshot(raw: bytes) -> SnapshotDoc:
    """An ``/api/v1/snapshot`` body; :class:`WireError` for anything else."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise WireError("oversize", f"a snapshot of {len(raw)} bytes (limit {MAX_DOCUMENT_BYTES})")
    try:
        return SnapshotDoc.model_validate_json(raw)
    except ValidationError as e:
        raise _refused(e) from None


class LineSplitter:
    """Newline-delimited lines out of a byte stream, never buffering more than ``limit`` bytes:
    a longer line raises :class:`WireError` (``oversize``) instead of growing the buffer."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        *lines, rest = self._buf.split(b"\n")
        if len(rest) > self._limit:
            raise WireError("oversize", f"a watch line longer than {self._limit} bytes")
        self._buf = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]


# ---------------------------------------------------------------------------------------------
# Writing (the exporter): from the frozen values of gpumon.devices.model


def encode(model: BaseModel) -> bytes:
    """One watch line (or a whole document), newline-terminated."""
    return model.model_dump_json().encode() + b"\n"


def verdict(v: HealthVerdict) -> Verdict:
    return Verdict(
        state=v.state, reasons=tuple(Reason(code=r.code, detail=r.detail, state=r.state) for r in v.reasons)
    )


def health_verdict(v: Verdict) -> HealthVerdict:
    return HealthVerdict(v.state, tuple(HealthReason(r.code, r.detail, r.state) for r in v.reasons))


def xids(events: Iterable[XidEvent], counts: Mapping[int, int]) -> tuple[Xid, ...]:
    """The latest event of each code, by code, keeping the most recent codes within the limit."""
    latest = sorted(events, key=lambda e: e.timestamp)[-MAX_XIDS_PER_GPU:]
    return tuple(
        Xid(code=e.xid, at=e.timestamp, count=max(1, counts.get(e.xid, 1)))
        for e in sorted(latest, key=lambda e: e.xid)
    )


def pod(ref: PodRef) -> Pod:
    return Pod(namespace=ref.namespace, pod=ref.pod, container=ref.container, uid=ref.uid)


def pod_ref(p: Pod) -> PodRef:
    return PodRef(p.namespace, p.pod, p.container, p.uid)


def placement(pods: Iterable[PodGpuUsage]) -> dict[str, tuple[PodRef, ...]]:
    """GPU UUID -> the pods (containers) attributed to it, sorted and without repeats, at most
    :data:`MAX_PODS` for the node."""
    by_gpu: dict[str, set[PodRef]] = {}
    for i, p in enumerate(pods):
        if i >= MAX_PODS:
            break
        by_gpu.setdefault(p.gpu_uuid, set()).add(p.ref)
    return {uuid: tuple(sorted(refs, key=_ref_key)) for uuid, refs in by_gpu.items()}


def _ref_key(r: PodRef) -> tuple[str, str, str, str]:
    return r.namespace, r.pod, r.container, r.uid


def gpu_status(g: GpuSample, pods: tuple[PodRef, ...]) -> GpuStatus:
    fast, slow = g.fast, g.slow
    return GpuStatus(
        gpu=g.identity.index,
        uuid=g.identity.uuid,
        health=verdict(g.health),
        temperature_celsius=None if fast is None else fast.temperature_gpu_celsius,
        ecc_uncorrected=None if slow is None else slow.ecc_uncorrected,
        row_remap_pending=None if slow is None else slow.row_remap_pending,
        row_remap_failure=None if slow is None else slow.row_remap_failure,
        recovery_action=None if slow is None else slow.recovery_action,
        lost=g.lost,
        xids=xids(g.xids, g.xid_counts),
        pods=tuple(pod(r) for r in pods),
    )


def state_line(snapshot: Snapshot | None, *, node: str, now: float) -> StateLine:
    where = placement(snapshot.pods) if snapshot else {}
    return StateLine(
        schema_version=SCHEMA_VERSION,
        node=node,
        time=now,
        backend_up=snapshot.backend_up if snapshot else False,
        gpus=tuple(
            gpu_status(g, where.get(g.identity.uuid, ())) for g in (snapshot.gpus if snapshot else ())
        ),
    )


def health_line(
    g: GpuSample, pods: tuple[PodRef, ...], previous: HealthState | None, *, node: str, at: float
) -> HealthLine:
    return HealthLine(
        schema_version=SCHEMA_VERSION, node=node, time=at, previous=previous, gpu=gpu_status(g, pods)
    )


def backend_line(up: bool, *, node: str, at: float) -> BackendLine:
    return BackendLine(schema_version=SCHEMA_VERSION, node=node, time=at, up=up)


def heartbeat_line(*, node: str, at: float) -> HeartbeatLine:
    return HeartbeatLine(schema_version=SCHEMA_VERSION, node=node, time=at)


def _memory(m: MemoryInfo | None) -> Memory | None:
    if m is None:
        return None
    return Memory(
        total_bytes=m.total_bytes,
        used_bytes=m.used_bytes,
        free_bytes=m.free_bytes,
        reserved_bytes=m.reserved_bytes,
    )


def _process(p: ProcessSample) -> Process:
    return Process(
        pid=p.pid,
        used_memory_bytes=p.used_memory_bytes,
        sm_utilization_ratio=p.sm_utilization_ratio,
        memory_utilization_ratio=p.memory_utilization_ratio,
        name=p.name,
    )


def _fast(f: FastFields | None) -> Fast | None:
    if f is None:
        return None
    return Fast(
        memory=_memory(f.memory),
        utilization_ratio=f.utilization_ratio,
        memory_utilization_ratio=f.memory_utilization_ratio,
        temperature_gpu_celsius=f.temperature_gpu_celsius,
        temperature_memory_celsius=f.temperature_memory_celsius,
        power_watts=f.power_watts,
        power_limit_watts=f.power_limit_watts,
        energy_joules=f.energy_joules,
        sm_clock_hertz=f.sm_clock_hertz,
        memory_clock_hertz=f.memory_clock_hertz,
        throttle_reasons=None if f.throttle_reasons is None else tuple(sorted(f.throttle_reasons)),
        processes=tuple(_process(p) for p in f.processes[:MAX_PROCESSES]),
    )


def _mig(m: MigInstance) -> Mig:
    return Mig(
        gpu_instance=m.gpu_instance,
        compute_instance=m.compute_instance,
        profile=m.profile,
        uuid=m.uuid,
        memory=_memory(m.memory),
    )


def _slow(s: SlowFields | None) -> Slow | None:
    if s is None:
        return None
    return Slow(
        pcie_replays=s.pcie_replays,
        ecc_corrected=s.ecc_corrected,
        ecc_uncorrected=s.ecc_uncorrected,
        remapped_rows_correctable=s.remapped_rows_correctable,
        remapped_rows_uncorrectable=s.remapped_rows_uncorrectable,
        row_remap_pending=s.row_remap_pending,
        row_remap_failure=s.row_remap_failure,
        mig_instances=tuple(_mig(m) for m in s.mig_instances[:MAX_MIG_INSTANCES]),
        recovery_action=s.recovery_action,
    )


def _identity(i: GpuIdentity) -> Identity:
    return Identity(
        index=i.index,
        uuid=i.uuid,
        model=i.model,
        pci_bus_id=i.pci_bus_id,
        serial=i.serial,
        mig_mode=i.mig_mode,
    )


def _driver(d: DriverInfo | None) -> Driver | None:
    if d is None:
        return None
    return Driver(driver_version=d.driver_version, cuda_version=d.cuda_version, nvml_version=d.nvml_version)


def _pod_usage(p: PodGpuUsage) -> PodUsage:
    return PodUsage(
        ref=pod(p.ref),
        gpu_index=p.gpu_index,
        gpu_uuid=p.gpu_uuid,
        used_memory_bytes=p.used_memory_bytes,
        utilization_ratio=p.utilization_ratio,
        allocated_memory_bytes=p.allocated_memory_bytes,
        allocated_core_ratio=p.allocated_core_ratio,
        allocated_resources=p.allocated_resources,
        unallocated=p.unallocated,
        mig=None if p.mig is None else _mig(p.mig),
    )


def snapshot_document(s: Snapshot) -> SnapshotDoc:
    return SnapshotDoc(
        schema_version=SCHEMA_VERSION,
        node=s.node,
        driver=_driver(s.driver),
        gpus=tuple(
            GpuDoc(
                identity=_identity(g.identity),
                fast=_fast(g.fast),
                slow=_slow(g.slow),
                health=verdict(g.health),
                sampled_at=g.sampled_at,
                lost=g.lost,
                last_xid=g.last_xid,
                xids=xids(g.xids, g.xid_counts),
            )
            for g in s.gpus
        ),
        pods=tuple(_pod_usage(p) for p in s.pods[:MAX_PODS]),
        taken_at=s.taken_at,
        backend_up=s.backend_up,
        complete=s.complete,
    )

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
  can legitimately grow (pods, processes, MIG instances, NVLink counters, DRA claims, Xid codes)
  so they never send what a reader refuses.
- **Checked against the device model.** Each wire model mirrors a frozen value of
  :mod:`gpumon.gpu.model` field by field, under the same names, and the writer copies the
  shared fields by name (:func:`_derived`); only fields whose wire form differs (bounded, sorted,
  reshaped for JSON) are written out by hand. Every field of the device model's GPU shapes is on
  the wire or in :data:`NOT_ON_THE_WIRE` with its reason: ``tests/unit/test_wire_coverage.py``
  fails on a field that is neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Annotated, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gpumon.gpu.model import (
    FastFields,
    GpuSample,
    HealthReason,
    HealthState,
    HealthVerdict,
    PodGpuUsage,
    PodRef,
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
# Names of one GPU or pod entry (throttle reasons, allocated resources, DRA claim devices) and
# small maps keyed by a fixed vocabulary (violation policies, NVLink directions).
MAX_NAMES: Final = 64
# NVLink error counters of one GPU, by (link, kind): 18 links x 3 kinds on today's largest parts.
MAX_NVLINK_COUNTERS: Final = 256
MAX_TEXT: Final = 4096

NOT_ON_THE_WIRE: Final[Mapping[str, str]] = {}
"""Fields of the device model's GPU shapes (``Class.field`` of :mod:`gpumon.gpu.model` and
the :mod:`gpumon.k8s.dra` values it holds) that the snapshot leaves out, each with why. Today every
field travels (``GpuSample.xid_counts`` as the count of each code with an event; the XID_OTHER
count is the exposition's alone). A field added to the model goes on the wire (an optional field
of the same name on its wire model below, so older readers keep working) or here, with its
reason: ``tests/unit/test_wire_coverage.py`` fails until one of them is done."""


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
    gpu_instance: Count | None = None
    compute_instance: Count | None = None


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
    throttle_reasons: tuple[Text, ...] | None = Field(default=None, max_length=MAX_NAMES)
    processes: tuple[Process, ...] = Field(default=(), max_length=MAX_PROCESSES)


class Mig(_WireModel):
    gpu_instance: Count
    compute_instance: Count
    profile: Text
    uuid: Text
    memory: Memory | None = None
    gpu_instance_profile: Text | None = None


class Gpm(_WireModel):
    """NVML GPM over the interval between two slow reads (gpu.model.Profiling)."""

    graphics_active_ratio: Number | None = None
    sm_active_ratio: Number | None = None
    sm_occupancy_ratio: Number | None = None
    tensor_active_ratio: Number | None = None
    fp64_active_ratio: Number | None = None
    fp32_active_ratio: Number | None = None
    fp16_active_ratio: Number | None = None
    dram_active_ratio: Number | None = None
    pcie_tx_bytes_per_second: Number | None = None
    pcie_rx_bytes_per_second: Number | None = None
    nvlink_tx_bytes_per_second: Number | None = None
    nvlink_rx_bytes_per_second: Number | None = None


class MigGpm(_WireModel):
    gpu_instance: Count
    profile: Text
    profiling: Gpm


class NvlinkError(_WireModel):
    """One NVLink error counter: JSON keys are strings, so the model's (link, kind) key is two
    fields here."""

    link: Index
    kind: Text
    count: Count


class Slow(_WireModel):
    pcie_replays: Count | None = None
    ecc_corrected: Count | None = None
    ecc_uncorrected: Count | None = None
    remapped_rows_correctable: Count | None = None
    remapped_rows_uncorrectable: Count | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    mig_instances: tuple[Mig, ...] = Field(default=(), max_length=MAX_MIG_INSTANCES)
    profiling: Gpm | None = None
    mig_profiling: tuple[MigGpm, ...] = Field(default=(), max_length=MAX_MIG_INSTANCES)
    encoder_utilization_ratio: Number | None = None
    decoder_utilization_ratio: Number | None = None
    fan_speed_ratio: Number | None = None
    performance_state: Count | None = None
    violation_seconds: Mapping[Text, Number] = Field(default_factory=dict, max_length=MAX_NAMES)
    nvlink_data_bytes: Mapping[Text, Count] = Field(default_factory=dict, max_length=MAX_NAMES)
    nvlink_data_bytes_per_second: Number | None = None
    nvlink_errors: tuple[NvlinkError, ...] = Field(default=(), max_length=MAX_NVLINK_COUNTERS)
    vgpu_licensed: bool | None = None
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


class ClaimName(_WireModel):
    namespace: Text
    name: Text


class DeviceName(_WireModel):
    driver: Text
    pool: Text
    device: Text


class Claim(_WireModel):
    """One device of one DRA claim that gives the container this GPU (gpumon.k8s.dra.ClaimDevice)."""

    claim: ClaimName
    device: DeviceName


class PodUsage(_WireModel):
    ref: Pod
    gpu_index: Index
    gpu_uuid: Text
    used_memory_bytes: Count | None = None
    utilization_ratio: Number | None = None
    allocated_memory_bytes: Count | None = None
    allocated_core_ratio: Number | None = None
    allocated_resources: tuple[Text, ...] = Field(default=(), max_length=MAX_NAMES)
    unallocated: bool = False
    mig: Mig | None = None  # the MIG device on the card gpu_uuid names, when it is one
    claims: tuple[Claim, ...] = Field(default=(), max_length=MAX_NAMES)


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
# Writing (the exporter): from the frozen values of gpumon.gpu.model


def encode(model: BaseModel) -> bytes:
    """One watch line (or a whole document), newline-terminated."""
    return model.model_dump_json().encode() + b"\n"


_Wire = TypeVar("_Wire", bound=_WireModel)


def _wire(model: type[_Wire], /, **fields: object) -> _Wire:
    """``model`` from ``fields``, which may hold values of the device model as they are: a wire
    model takes each of its fields from the attribute of the same name (pydantic's
    ``from_attributes``), all in one validation."""
    return model.model_validate(fields, from_attributes=True)


def _derived(model: type[_Wire], value: object, /, **differs: object) -> _Wire:
    """``model`` from the device-model value ``value``, field by field under the same names,
    except ``differs``: the fields whose wire form is not the model's. A wire field that is
    neither fails here, loudly."""
    shared = {name: getattr(value, name) for name in model.model_fields if name not in differs}
    return _wire(model, **shared, **differs)


def health_verdict(v: Verdict) -> HealthVerdict:
    return HealthVerdict(v.state, tuple(HealthReason(r.code, r.detail, r.state) for r in v.reasons))


def xids(events: Iterable[XidEvent], counts: Mapping[int, int]) -> tuple[Xid, ...]:
    """The latest event of each code, by code, keeping the most recent codes within the limit."""
    latest = sorted(events, key=lambda e: e.timestamp)[-MAX_XIDS_PER_GPU:]
    return tuple(
        Xid(code=e.xid, at=e.timestamp, count=max(1, counts.get(e.xid, 1)))
        for e in sorted(latest, key=lambda e: e.xid)
    )


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
    return _wire(
        GpuStatus,
        gpu=g.identity.index,
        uuid=g.identity.uuid,
        health=g.health,
        temperature_celsius=None if fast is None else fast.temperature_gpu_celsius,
        ecc_uncorrected=None if slow is None else slow.ecc_uncorrected,
        row_remap_pending=None if slow is None else slow.row_remap_pending,
        row_remap_failure=None if slow is None else slow.row_remap_failure,
        recovery_action=None if slow is None else slow.recovery_action,
        lost=g.lost,
        xids=xids(g.xids, g.xid_counts),
        pods=pods,
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


def _fast(f: FastFields) -> Fast:
    return _derived(
        Fast,
        f,
        throttle_reasons=None if f.throttle_reasons is None else tuple(sorted(f.throttle_reasons)),
        processes=f.processes[:MAX_PROCESSES],
    )


def _slow(s: SlowFields) -> Slow:
    return _derived(
        Slow,
        s,
        mig_instances=s.mig_instances[:MAX_MIG_INSTANCES],
        mig_profiling=s.mig_profiling[:MAX_MIG_INSTANCES],
        nvlink_errors=tuple(
            NvlinkError(link=link, kind=kind, count=count)
            for (link, kind), count in sorted(s.nvlink_errors.items())[:MAX_NVLINK_COUNTERS]
        ),
    )


def _gpu_doc(g: GpuSample) -> GpuDoc:
    return _derived(
        GpuDoc,
        g,
        fast=None if g.fast is None else _fast(g.fast),
        slow=None if g.slow is None else _slow(g.slow),
        xids=xids(g.xids, g.xid_counts),
    )


def _claims_bounded(p: PodGpuUsage) -> PodGpuUsage:
    return p if len(p.claims) <= MAX_NAMES else replace(p, claims=p.claims[:MAX_NAMES])


def snapshot_document(s: Snapshot) -> SnapshotDoc:
    return _derived(
        SnapshotDoc,
        s,
        schema_version=SCHEMA_VERSION,
        gpus=tuple(_gpu_doc(g) for g in s.gpus),
        pods=tuple(_claims_bounded(p) for p in s.pods[:MAX_PODS]),
    )

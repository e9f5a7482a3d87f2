"""What a pending pod asks for, and how many nodes of a pool's template its kind would fill.

Pure: parsing pods into :class:`PodDemand`, deciding whether a node template can host a pod
(taints and tolerations, node selector, required node affinity, size), and a bin-packing
simulation that places pods onto template nodes the way the scheduler and the sharing plugins
would. Amounts are integers in thousandths of a unit (Kubernetes' milli-units), so ``500m`` CPU
and ``5`` GiB of ``aliyun.com/gpu-mem`` are exact.

Shared GPUs (Alibaba gpushare and cGPU): the node advertises ``aliyun.com/gpu-mem`` summed over
its cards and ``aliyun.com/gpu-core.percentage`` at 100 per card, but the scheduler extender
puts each pod on one card: the pod's memory and core share must fit what one card has left.
Whole GPUs, MIG profiles (``nvidia.com/mig-*``) and time-sliced replicas are plain per-node
counts. Devices asked for through DRA ResourceClaims are allocated on the devices a template
publishes (:mod:`gpumon.controller.core.device_claims`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from gpumon.controller.core.device_claims import (
    ClaimDemand,
    ClaimRequests,
    DeviceClassView,
    TemplateDevices,
    resolve,
)
from gpumon.controller.core.objects import GpuResources, Taint
from gpumon.k8s.dra import ClaimRef, pod_claims
from gpumon.k8s.resources import (
    CGPU_CORE_RESOURCE,
    CGPU_CORE_STEP,
    GPUSHARE_MEMORY_RESOURCE,
    NODE_BASICS,
    PODS,
    gpu_only,
    milli,
    units,
)
from gpumon.k8s.selectors import Requirement

_EMPTY: Mapping[str, Any] = MappingProxyType({})

_SCHEDULING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# ---------------------------------------------------------------------------------------------
# Scheduling constraints


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == (taint.value or "")


def _requirement_holds(r: Requirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(r.key)
    match r.operator:
        case "In":
            return value is not None and value in r.values
        case "NotIn":
            return value is None or value not in r.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                have, bound = int(value or ""), int(next(iter(r.values)))
            except (ValueError, StopIteration):
                return False
            return have > bound if r.operator == "Gt" else have < bound
    return False


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """One term of required node affinity: every requirement must hold. ``by_field`` holds
    ``matchFields`` requirements (``metadata.name``), which a node that does not exist yet
    cannot meet."""

    requirements: tuple[Requirement, ...] = ()
    by_field: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return not self.by_field and all(_requirement_holds(r, labels) for r in self.requirements)


# ---------------------------------------------------------------------------------------------
# What a node offers and what a pod asks


@dataclass(frozen=True, slots=True)
class SharedCards:
    """A node's GPUs as the gpushare/cGPU plugins split them: memory units per card (in the
    device plugin's unit, GiB by default) and 100 % of cores per card."""

    cards: int
    memory_per_card: int  # thousandths of a unit


CARD_CORE = 100 * 1000  # one card's whole core share, in thousandths of a percent


@dataclass(frozen=True, slots=True)
class Template:
    """What one new node of a pool offers the scheduler."""

    resources: Mapping[str, int]  # allocatable, in thousandths
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    taints: tuple[Taint, ...] = ()
    shared: SharedCards | None = None
    # The DRA devices its ResourceSlice will publish (with the matching cache): None for none.
    dra: TemplateDevices | None = field(default=None, compare=False)

    @property
    def gpu_resources(self) -> frozenset[str]:
        """Resources of the template that only GPU nodes have: their absence from a joined
        node's allocatable means its device plugin has not registered yet."""
        return gpu_only(self.resources)


@dataclass(frozen=True, slots=True)
class PodDemand:
    namespace: str
    name: str
    uid: str
    requests: Mapping[str, int]  # the pod's effective requests, in thousandths, "pods" included
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    affinity: tuple[NodeSelectorTerm, ...] = ()  # OR of terms; () when the pod has none
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    pending_since: float | None = None  # when the scheduler first called it unschedulable
    # DRA: the ResourceClaims it names; claims_missing while the resourceclaim controller has
    # not created one of them yet. ``claims`` are those claims resolved for planning
    # (:func:`with_claims`), ``refused`` set when the planner cannot evaluate them.
    claim_refs: tuple[ClaimRef, ...] = ()
    claims_missing: bool = False
    claims: tuple[ClaimDemand, ...] = ()
    refused: SchedulerRefusal | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def card_memory(self) -> int:
        return self.requests.get(GPUSHARE_MEMORY_RESOURCE, 0)

    @property
    def card_core(self) -> int:
        return self.requests.get(CGPU_CORE_RESOURCE, 0)


@dataclass(frozen=True, slots=True)
class SchedulerRefusal:
    """Why no GPU scheduler would ever place a pod, whatever the node: never demand, reported."""

    kind: str  # a metric label, one of REFUSAL_KINDS
    message: str


REFUSAL_KINDS = ("cgpu_core_step", "dra_unsupported", "dra_unevaluable")


def refusal(pod: PodDemand, templates: Iterable[Template] = ()) -> SchedulerRefusal | None:
    """Why the pod is never demand, or None.

    - Its DRA claims use a form the planner does not evaluate, or a selector that does not
      compile, or one that has no boolean value on a device of one of ``templates`` (a missing
      attribute, an unknown function): the scheduler's allocation stops on such an error too,
      and whether another template would do is not guessed.
    - A cGPU core share that is not a whole number of steps: ACK's scheduler refuses such a job
      ("Allocate computing power by scheduling shared GPU": multiples of 5, at least 5). Checked
      on the pod's sum, which is what lands on its one card."""
    if pod.refused is not None:
        return pod.refused
    if pod.claims:
        for template in templates:
            why = template.dra.unevaluable(pod.claims) if template.dra is not None else None
            if why is not None:
                return SchedulerRefusal("dra_unevaluable", why + ": not counted as demand")
    core = pod.card_core
    if core and core % (CGPU_CORE_STEP * 1000):
        return SchedulerRefusal(
            REFUSAL_KINDS[0],
            f"asks {units(core)} % of a card's cores ({CGPU_CORE_RESOURCE}); cGPU only takes multiples "
            f"of {CGPU_CORE_STEP}, so no node would run it: not counted as demand",
        )
    return None


def why_not_hosted(template: Template, pod: PodDemand) -> str | None:
    """Why a node of ``template`` could never run ``pod`` (even empty), or None when it can."""
    refused = refusal(pod, (template,))
    if refused is not None:
        return refused.message
    for taint in template.taints:
        if taint.effect in _SCHEDULING_TAINT_EFFECTS and not any(t.tolerates(taint) for t in pod.tolerations):
            return f"untolerated taint {taint.key}={taint.value or ''}:{taint.effect}"
    for key, value in pod.node_selector.items():
        if template.labels.get(key) != value:
            return f"node selector {key}={value}"
    if pod.affinity and not any(term.matches(template.labels) for term in pod.affinity):
        return "required node affinity"
    for resource, amount in pod.requests.items():
        if resource in NODE_BASICS and resource not in template.resources:
            continue  # the template does not say: not what limits a GPU node
        if amount > template.resources.get(resource, 0):
            return f"asks {units(amount)} {resource}, a node has {units(template.resources.get(resource, 0))}"
    shared = template.shared
    if pod.card_memory or pod.card_core:
        if shared is None:
            return "asks for a shared GPU, the template has none"
        if pod.card_memory > shared.memory_per_card:
            return (
                f"asks {units(pod.card_memory)} {GPUSHARE_MEMORY_RESOURCE} on one card, a card has "
                + units(shared.memory_per_card)
            )
        if pod.card_core > CARD_CORE:
            return f"asks {units(pod.card_core)} % of one card's cores"
    if pod.claims:
        dra = template.dra
        if dra is None:
            return "asks for DRA devices, the template publishes none"
        if dra.allocate(pod.claims, [True] * len(dra.devices)) is None:
            return "its claims' devices are not all on one node of the template"
    return None


# ---------------------------------------------------------------------------------------------
# Parsing pods


def _conditions(obj: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (obj.get("status") or {}).get("conditions") or ()


def is_unschedulable(obj: Mapping[str, Any]) -> bool:
    """Pending, not bound, not terminating, and the scheduler said no (PodScheduled=False,
    reason Unschedulable); a gated pod (SchedulingGated) is not demand yet."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp") or (obj.get("spec") or {}).get("nodeName"):
        return False
    if (obj.get("status") or {}).get("phase", "Pending") != "Pending":
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in _conditions(obj)
    )


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    # Extended resources must have requests equal to limits; a request left out defaults to the limit.
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    out: dict[str, int] = {}
    for name, value in merged.items():
        amount = milli(value)
        if amount is not None and amount > 0:
            out[str(name)] = amount
    return out


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests, as the scheduler computes them: the containers' sum or the largest
    init container's, whichever is larger, per resource (sidecar init containers, which keep
    running, add to the sum), plus the pod overhead and one pod slot."""
    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for r, v in _container_requests(c).items():
            total[r] = total.get(r, 0) + v
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        req = _container_requests(c)
        for r, v in req.items():
            # A restartable init container keeps its share while later ones run.
            init_peak[r] = max(init_peak.get(r, 0), sidecars.get(r, 0) + v)
        if c.get("restartPolicy") == "Always":
            for r, v in req.items():
                sidecars[r] = sidecars.get(r, 0) + v
    for r, v in sidecars.items():
        total[r] = total.get(r, 0) + v
    for r, v in init_peak.items():
        total[r] = max(total.get(r, 0), v)
    for r, v in (spec.get("overhead") or {}).items():
        amount = milli(v)
        if amount:
            total[r] = total.get(r, 0) + amount
    total[PODS] = 1000
    return total


def _terms(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...]:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return tuple(
        NodeSelectorTerm(
            tuple(
                Requirement(
                    str(e.get("key", "")), str(e.get("operator", "")), frozenset(e.get("values") or ())
                )
                for e in term.get("matchExpressions") or ()
            ),
            by_field=bool(term.get("matchFields")),
        )
        for term in required.get("nodeSelectorTerms") or ()
    )


def _pending_since(obj: Mapping[str, Any], parse_time: Callable[[str], float | None]) -> float | None:
    for c in _conditions(obj):
        if c.get("type") == "PodScheduled" and c.get("lastTransitionTime"):
            return parse_time(str(c["lastTransitionTime"]))
    return None


def _claims_missing(obj: Mapping[str, Any]) -> bool:
    """Whether a claim the pod's templates stand for is not created yet (no status entry)."""
    spec_entries = (obj.get("spec") or {}).get("resourceClaims") or ()
    decided = {s.get("name") for s in (obj.get("status") or {}).get("resourceClaimStatuses") or ()}
    return any(not e.get("resourceClaimName") and e.get("name") not in decided for e in spec_entries)


def pending_gpu_pod(
    obj: Mapping[str, Any],
    gpu: GpuResources,
    parse_time: Callable[[str], float | None],
) -> PodDemand | None:
    """The pod as demand when it is unschedulable and asks for a GPU resource or names DRA
    ResourceClaims (which the autoscaler resolves, :func:`with_claims`), else None."""
    if not is_unschedulable(obj):
        return None
    spec = obj.get("spec") or {}
    requests = pod_requests(spec)
    claim_refs = pod_claims(obj)
    if not any(gpu.matches(r) for r in requests) and not spec.get("resourceClaims"):
        return None
    meta = obj.get("metadata") or {}
    return PodDemand(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        requests=MappingProxyType(requests),
        node_selector=MappingProxyType({str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}),
        affinity=_terms(spec),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or ()
        ),
        priority=int(spec.get("priority") or 0),
        pending_since=_pending_since(obj, parse_time),
        claim_refs=claim_refs,
        claims_missing=_claims_missing(obj),
    )


def with_claims(
    pod: PodDemand, claims: Mapping[str, ClaimRequests], classes: Mapping[str, DeviceClassView]
) -> PodDemand | None:
    """The pod with its DRA claims resolved for planning; None when it is no demand yet or no
    more: a claim not created or not in the cache yet, or one already allocated (its devices
    are on a node already, which new nodes cannot change)."""
    if not pod.claim_refs and not pod.claims_missing:
        return pod
    if pod.claims_missing:
        return None
    views = [claims.get(str(ref)) for ref in pod.claim_refs]
    present = [v for v in views if v is not None]
    if len(present) < len(views) or any(v.allocated for v in present):
        return None
    resolved = resolve(present, classes)
    if resolved and isinstance(resolved[0], str):
        kind, why = resolved
        return replace(pod, refused=SchedulerRefusal(str(kind), f"{why}: not counted as demand"))
    return replace(pod, claims=tuple(c for c in resolved if isinstance(c, ClaimDemand)))


# ---------------------------------------------------------------------------------------------
# Bin packing


def size(pod: PodDemand, template: Template) -> float:
    """The pod's largest share of any resource of one template node: big pods are placed first."""
    shares = [
        amount / template.resources[r] for r, amount in pod.requests.items() if template.resources.get(r)
    ]
    if template.shared is not None and template.shared.memory_per_card:
        shares.append(pod.card_memory / template.shared.memory_per_card)
    if pod.claims and template.dra is not None and template.dra.devices:
        shares.append(template.dra.wanted(pod.claims) / len(template.dra.devices))
    return max(shares, default=0.0)


class _Node:
    __slots__ = ("cards", "devices", "free")

    def __init__(self, template: Template) -> None:
        self.free = dict(template.resources)
        shared = template.shared
        # [memory free, core free] per card
        self.cards = [[shared.memory_per_card, CARD_CORE] for _ in range(shared.cards)] if shared else []
        # Free or not, per DRA device of the template.
        self.devices = [True] * (len(template.dra.devices) if template.dra is not None else 0)

    def card_for(self, pod: PodDemand) -> int | None:
        """The card the gpushare extender's binpack policy picks: the fullest one that fits."""
        best: int | None = None
        for i, (mem, core) in enumerate(self.cards):
            if (
                mem >= pod.card_memory
                and core >= pod.card_core
                and (best is None or mem < self.cards[best][0])
            ):
                best = i
        return best

    def take(self, pod: PodDemand, template: Template, claims: Sequence[ClaimDemand]) -> bool:
        """Place the pod, allocating ``claims`` (its claims not placed with another pod yet)."""
        free = self.free
        wanted = [(r, a) for r, a in pod.requests.items() if r in free or r not in NODE_BASICS]
        if any(free.get(r, 0) < amount for r, amount in wanted):
            return False
        card = None
        if pod.card_memory or pod.card_core:
            card = self.card_for(pod)
            if card is None:
                return False
        devices = None
        if claims:
            if template.dra is None:
                return False
            devices = template.dra.allocate(claims, self.devices)
            if devices is None:
                return False
        for r, amount in wanted:
            free[r] -= amount
        if card is not None:
            self.cards[card][0] -= pod.card_memory
            self.cards[card][1] -= pod.card_core
        if devices is not None:
            self.devices = devices
        return True

    def empty(self, template: Template) -> bool:
        return self.free == template.resources and all(self.devices)


class Packer:
    """First-fit onto a pool's nodes that are there or on their way and empty, then onto new
    nodes. Callers offer pods biggest first (:func:`size`) for first-fit-decreasing."""

    def __init__(self, template: Template, empty_nodes: int) -> None:
        self.template = template
        self.initial = empty_nodes
        self._nodes = [_Node(template) for _ in range(empty_nodes)]
        # A claim several pods share is allocated once: its pods go where it went.
        self._claim_node: dict[str, int] = {}

    @property
    def new_nodes(self) -> int:
        return len(self._nodes) - self.initial

    def place(self, pod: PodDemand, *, may_open: bool) -> int | None:
        """The index of the node the pod went to (new nodes after the initial ones), or None."""
        placed = {self._claim_node[c.key] for c in pod.claims if c.key in self._claim_node}
        if len(placed) > 1:
            return None  # claims it shares went to different nodes: no node has them all
        new_claims = [c for c in pod.claims if c.key not in self._claim_node]
        for i, node in enumerate(self._nodes):
            if (not placed or i in placed) and node.take(pod, self.template, new_claims):
                return self._placed(pod, i)
        if not may_open or placed:
            return None
        node = _Node(self.template)
        if not node.take(pod, self.template, new_claims):
            return None  # bigger than a whole node: callers filter with why_not_hosted first
        self._nodes.append(node)
        return self._placed(pod, len(self._nodes) - 1)

    def _placed(self, pod: PodDemand, index: int) -> int:
        for c in pod.claims:
            self._claim_node.setdefault(c.key, index)
        return index

    def still_empty(self, start: int = 0, stop: int | None = None) -> int:
        """How many of the initial nodes [start, stop) nothing was placed on."""
        end = self.initial if stop is None else stop
        return sum(1 for node in self._nodes[start:end] if node.empty(self.template))

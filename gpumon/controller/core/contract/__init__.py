"""The controller's public contract: every key it writes or reads on an object, in one place.

docs/architecture.md ("The node-health contract") lists them; docs/controller.md explains each key.
The taint key is never ``nvidia.com/gpu``: GPU pods tolerate that key through the
ExtendedResourceToleration admission plugin, so it would not keep them away.

The names are here. What gpumon keeps under them is written and read back by one module per
kind of record beside this one, so that a new leader, ``gpumon status`` and the docs read each
record the same way: :mod:`.node` (what a quarantined Node carries), :mod:`.breakers` (the open
circuit breakers on the controller's ConfigMap), :mod:`.autoscaler` (what the autoscaler
remembers on a pool's ``/scale`` target) and :mod:`.repair` (the repair ladder's attempts on a
Node). A new kind of record gets its names here and its
codec in a module of its own.
"""

from __future__ import annotations

import enum

# Every key of gpumon's own starts with this (a node view keeps those annotations, and of
# others only Karpenter's do-not-disrupt, which the quarantine sets).
KEY_PREFIX = "gpumon.io/"

TAINT_KEY = "gpumon.io/gpu-unhealthy"
CONDITION_TYPE = "GpuUnhealthy"
# Set True on a Node whose repair ladder reached replacement while a MachineHealthCheck covers its
# Machine: the check replaces it (its unhealthyNodeConditions list this type), gpumon deletes
# nothing. False once the ladder ends with the Node still there.
REPLACEMENT_CONDITION_TYPE = "GpuReplacementRequested"

ANNOTATION_UNHEALTHY_GPUS = "gpumon.io/unhealthy-gpus"
ANNOTATION_QUARANTINED_AT = "gpumon.io/quarantined-at"
ANNOTATION_CORDON_PREEXISTING = "gpumon.io/cordon-preexisting"
# Also written (docs/controller.md): a gpumon-keyed taint a person placed before
# gpumon acted, and when the current drain began (its deadline counts from here).
ANNOTATION_TAINT_PREEXISTING = "gpumon.io/taint-preexisting"
ANNOTATION_DRAIN_STARTED_AT = "gpumon.io/drain-started-at"
# The repair ladder's record: what was tried on the node (codec: .repair).
ANNOTATION_REPAIR = "gpumon.io/repair"
# On a repair Job and its pod: which node it repairs (a node's name may exceed a label value's 63
# characters, so the label carries a digest and the annotation the name), and which step it is.
LABEL_REPAIR_NODE = "gpumon.io/repair-node"
ANNOTATION_REPAIR_NODE = "gpumon.io/repair-node"
LABEL_REPAIR_STEP = "gpumon.io/repair-step"
# On a quarantined Karpenter node: the value Karpenter's do-not-disrupt annotation had before
# gpumon set it (JSON; null: there was none), put back on recovery.
ANNOTATION_DO_NOT_DISRUPT_PREEXISTING = "gpumon.io/do-not-disrupt-preexisting"

# On a Node being scaled down: when gpumon cordoned it to drain it.
REMOVING_ANNOTATION = "gpumon.io/scale-down-started-at"

LABEL_STATE = "gpumon.io/state"
LABEL_EXCLUDE = "gpumon.io/exclude"
# The pool a node belongs to, for the breaker's counts and status (config may name another label).
LABEL_POOL = "gpumon.io/pool"

# On the controller's own ConfigMap: a tripped breaker per pool, and the runtime pause switch.
BREAKER_ANNOTATION_PREFIX = "breaker.gpumon.io/"
ANNOTATION_PAUSED = "gpumon.io/paused"
# Also there: a repair's replacement under way, one per node (its Node goes with the
# replacement, so the record cannot stay on it; codec: .repair).
REPLACEMENT_ANNOTATION_PREFIX = "replace.gpumon.io/"

# On a pool's /scale target: what the autoscaler remembers between rounds.
RECORD_ANNOTATION = "gpumon.io/autoscaler"

# Cluster API's keys: gpumon marks a node's Machine for deletion, reads which Machine a Node is,
# and leaves a pool alone that cluster-autoscaler's Cluster API provider sizes (its bounds).
DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
# The Machine behind a Node, as a repair's replacement deletes it (core/node_owner.py).
MACHINE_API_VERSION = "cluster.x-k8s.io/v1beta2"
CA_MIN_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
CA_MAX_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
# Karpenter's label on the Nodes it launched (their NodePool): a pool with such nodes is Karpenter's.
KARPENTER_NODEPOOL_LABEL = "karpenter.sh/nodepool"
# Set ("true") on a Karpenter node while gpumon quarantines it: Karpenter's consolidation and
# drift leave such a node alone (its own node repair does not), so the empty quarantined node
# and gpumon's record on it stay until gpumon decides. Read from the Node once it registered.
KARPENTER_DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"

# On gpumon's DeviceTaintRules. Annotations, not labels: a node's name may be longer than a
# label value may be.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpumon"
RULE_NODE_ANNOTATION = "gpumon.io/node"
RULE_GPU_ANNOTATION = "gpumon.io/gpu-uuid"

# Read, never written: a static pod's mirror, which no eviction can move.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

RECOVERED_REASON = "GpuHealthy"


class NodePhase(enum.StrEnum):
    """Values of the ``gpumon.io/state`` label."""

    QUARANTINED = "quarantined"
    DRAINING = "draining"
    DRAINED = "drained"
    RECOVERING = "recovering"
    # The repair ladder's steps (gpumon.controller.core.repair).
    RESETTING = "resetting"
    REBOOTING = "rebooting"
    REPLACING = "replacing"
    VALIDATING = "validating"


# While one of these runs, gpumon.io/state says so, even as the findings clear through the
# hysteresis (which is "recovering" otherwise): the ladder decides when the quarantine can lift.
REPAIR_PHASES = frozenset(
    {NodePhase.RESETTING, NodePhase.REBOOTING, NodePhase.REPLACING, NodePhase.VALIDATING}
)


# Events and log lines about a decision that dry-run kept from being written start with this.
DRY_RUN_PREFIX = "[dry-run] "

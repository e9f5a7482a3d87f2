"""The node health contract: every key the controller writes on a Node, in one place.

docs/architecture.md ("The node-health contract") lists them; docs/controller.md explains each key.
The taint key is never ``nvidia.com/gpu``: GPU pods tolerate that key through the
ExtendedResourceToleration admission plugin, so it would not keep them away.
"""

from __future__ import annotations

import enum

TAINT_KEY = "gpumon.io/gpu-unhealthy"
CONDITION_TYPE = "GpuUnhealthy"

ANNOTATION_UNHEALTHY_GPUS = "gpumon.io/unhealthy-gpus"
ANNOTATION_QUARANTINED_AT = "gpumon.io/quarantined-at"
ANNOTATION_CORDON_PREEXISTING = "gpumon.io/cordon-preexisting"
# Also written (docs/controller.md): a gpumon-keyed taint a person placed before
# gpumon acted, and when the current drain began (its deadline counts from here).
ANNOTATION_TAINT_PREEXISTING = "gpumon.io/taint-preexisting"
ANNOTATION_DRAIN_STARTED_AT = "gpumon.io/drain-started-at"

LABEL_STATE = "gpumon.io/state"
LABEL_EXCLUDE = "gpumon.io/exclude"

# On the controller's own ConfigMap: a tripped breaker per pool, and the runtime pause switch.
BREAKER_ANNOTATION_PREFIX = "breaker.gpumon.io/"
ANNOTATION_PAUSED = "gpumon.io/paused"

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

RECOVERED_REASON = "GpuHealthy"


class NodePhase(enum.StrEnum):
    """Values of the ``gpumon.io/state`` label."""

    QUARANTINED = "quarantined"
    DRAINING = "draining"
    DRAINED = "drained"
    RECOVERING = "recovering"


# Events and log lines about a decision that dry-run kept from being written start with this.
DRY_RUN_PREFIX = "[dry-run] "

"""Reads of what the controller keeps on objects that no informer of its caches: a pool's
``/scale`` and the target's annotations (its replicas, and the autoscaler's record,
:mod:`gpumon.controller.core.contract.autoscaler`). Both the autoscaler and ``gpumon status`` read
through here, beside the writes in :mod:`gpumon.controller.act` and never through them, so that
a reader of the contract imports no write.
"""

from __future__ import annotations

from gpumon.controller.core.pools import ScaleState, ScaleTarget, scale_state
from gpumon.kube.client import KubeApi


async def read_scale(api: KubeApi, target: ScaleTarget) -> ScaleState:
    obj = await api.get(target.path)
    return scale_state(obj, await api.get(target.scale_path))

"""A node's pods, listed through the API when a decision about that node needs them.

The controller keeps no cache of the fleet's Pods. At 10,000 nodes they were 100,000 objects:
most of a restart's initial list (the restart took 46 s to its first decision, against a goal of
15), most of the process's memory, and a watch whose every event the loop had to convert,
although the controller acts on the pods of a few nodes only (docs/benchmarks.md). Three readers
ask for a node's pods, each when that node matters:

- ``drain``: each look at a node whose GPUs want it drained (every ``drain_check_seconds``
  while pods are left to evict);
- ``repair``: each round of a node on the repair ladder;
- ``scale_down``: a pool node whose signals do not show it busy, and once more right before it
  is cordoned for removal.

Each is one list by ``spec.nodeName``, the field the API server's watch cache indexes for the
kubelets' own watches: its cost to the API server is the node's pods, not the fleet's. A list
also tells the evictor which of the pods it evicted from that node are gone, so that it stops
remembering them (:meth:`gpumon.controller.act.evict.Evictor.settle`).
"""

from __future__ import annotations

from collections.abc import Callable

from gpumon.controller.act.evict import Evictor
from gpumon.controller.core.objects import GpuResources, PodView, pod_from_json
from gpumon.kube.client import KubeApi, KubeError

PODS_PATH = "/api/v1/pods"
# Pages of a node's pods: the kubelet's default limit is 110 pods, so one page nearly always.
_PAGE = 500


class NodePods:
    """Lists one node's pods for a reader; ``on_list(reader, result)`` counts every list
    (result ``ok`` or the error's type), ``on_skip(reader)`` every pod left out as malformed."""

    def __init__(
        self,
        api: KubeApi,
        resources: GpuResources,
        evictor: Evictor,
        *,
        on_list: Callable[[str, str], None] = lambda reader, result: None,
        on_skip: Callable[[str], None] = lambda reader: None,
    ) -> None:
        self._api = api
        self._resources = resources
        self._evictor = evictor
        self._on_list = on_list
        self._on_skip = on_skip

    async def list(self, node: str, reader: str) -> list[PodView]:
        """Every pod bound to ``node`` (raises :class:`KubeError`, counted, when the API fails)."""
        pods: list[PodView] = []
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(_PAGE)}
        try:
            while True:
                doc = await self._api.get(PODS_PATH, params)
                for obj in doc.get("items") or ():
                    try:
                        pods.append(pod_from_json(obj, self._resources))
                    except (KeyError, TypeError, AttributeError, ValueError):
                        self._on_skip(reader)
                cont = (doc.get("metadata") or {}).get("continue")
                if not cont:
                    break
                params = {**params, "continue": str(cont)}
        except KubeError as e:
            self._on_list(reader, type(e).__name__)
            raise
        self._on_list(reader, "ok")
        self._evictor.settle(node, {p.uid for p in pods})
        return pods

    def gone(self, node: str) -> None:
        """The node is deleted: nothing evicted from it needs remembering."""
        self._evictor.settle(node, set())

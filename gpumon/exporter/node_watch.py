"""One kind of this node's objects, kept current by gpumon's one informer
(:mod:`gpumon.kube.informer`: list, watch, resume, relist on 410, backoff), by UID, with every
failure counted in the exporter's error metric under ``source``: the pods (:mod:`pod_metadata`)
and the ResourceSlices (:mod:`dra_slices`), each with ``fieldSelector=spec.nodeName=<node>``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpumon.devices.backend import ErrorSink
from gpumon.kube.informer import Informer, Selection, View, failure_kind, uid_key

T = TypeVar("T")


def node_view(
    path: str,
    node: str,
    convert: Callable[[Mapping[str, Any]], T | None],
    errors: ErrorSink,
    *,
    source: str,
    name: str,
    **options: Any,
) -> View[T]:
    """The objects of ``path`` on ``node`` converted, by UID; run ``view.informer.run(api)``.
    ``options`` go to the :class:`~gpumon.kube.informer.Informer`."""
    informer = Informer(
        Selection(path, field_selector=f"spec.nodeName={node}"),
        on_error=lambda _informer, e: errors(source, failure_kind(e)),
        **options,
    )
    return informer.view(convert, name=name, key=uid_key)

"""Annotations on the controller's state ConfigMap: the open breakers and the replacements
under way, records a new leader reads back through its informer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.kube.client import KubeApi, NotFound


async def annotate_state(
    api: KubeApi, namespace: str, name: str, annotations: Mapping[str, str | None]
) -> Mapping[str, Any]:
    """A merge patch of ``annotations`` (``None`` removes one), creating the ConfigMap when
    missing; returns the object as written."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    try:
        return await api.patch(path, {"metadata": {"annotations": dict(annotations)}})
    except NotFound:
        kept = {k: v for k, v in annotations.items() if v is not None}
        return await api.post(
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"metadata": {"name": name, "namespace": namespace, "annotations": kept}},
        )

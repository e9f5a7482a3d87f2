"""Where the exporters are: node name -> exporter base URL, from config or from the API.

The direct source subscribes to each; ``changed`` tells it to look at the map again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpumon.kube.informer import Selection, View
from gpumon.kube.registry import Informers


class Endpoints(Protocol):
    changed: asyncio.Event

    def current(self) -> Mapping[str, str]:
        """Node name -> exporter base URL."""


class StaticEndpoints:
    """A fixed node -> URL map from config (tests, demo, or exporters outside the cluster)."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self._urls = dict(urls)
        self.changed = asyncio.Event()
        self.changed.set()

    def current(self) -> Mapping[str, str]:
        return self._urls


def _exporter_endpoint(port: int, scheme: str) -> Callable[[Mapping[str, Any]], tuple[str, str] | None]:
    def convert(obj: Mapping[str, Any]) -> tuple[str, str] | None:
        status = obj.get("status") or {}
        node = (obj.get("spec") or {}).get("nodeName")
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not node or not ip:
            return None
        host = f"[{ip}]" if ":" in ip else ip
        return str(node), f"{scheme}://{host}:{port}"

    return convert


class DiscoveredEndpoints:
    """Exporter pods found through the API (namespace + label selector), by node."""

    def __init__(self, informers: Informers, namespace: str, selector: str, port: int, scheme: str) -> None:
        self.changed = asyncio.Event()
        self.view: View[tuple[str, str]] = informers.informer(
            Selection(f"/api/v1/namespaces/{namespace}/pods", label_selector=selector)
        ).view(
            _exporter_endpoint(port, scheme),
            name="exporter-pods",
            on_change=lambda key, old, new: self.changed.set(),
        )

    def current(self) -> Mapping[str, str]:
        return dict(self.view.items().values())

"""An informer's initial list survives an etcd compaction between its pages, on the real API
server and etcd: the expired ``continue`` token is answered by one list without paging (as
client-go's pager does), not by listing again from page one (issue #29).

etcd is compacted the way the API server's own compactor does it every 5 minutes
(k8s.io/apiserver/pkg/storage/etcd3/compact.go): a compaction, then ``compact_rev_key`` set to
its revision. The second step matters: with ListFromCacheSnapshot (beta, on in v1.36) the API
server serves continue pages from its watch cache's snapshots, and drops the compacted ones only
when its cacher reads that key (polled every 15 s); until then the token still works."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import aiohttp

from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.waiting import eventually
from gpumon.kube.client import Gone, Json, KubeClient
from gpumon.kube.informer import Informer, Selection
from gpumon.kube.kubeconfig import from_kubeconfig

LABEL = "gpumon-test/paged"
OBJECTS = 13
PAGE = 4  # 4 pages


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def compact_etcd(etcd: str) -> int:
    """Compact etcd at a revision newer than anything read so far, as the API server would;
    returns that revision."""
    async with aiohttp.ClientSession() as http:

        async def call(method: str, body: Mapping[str, Any]) -> dict[str, Any]:
            async with http.post(f"{etcd}/v3/{method}", json=body) as resp:
                resp.raise_for_status()
                answer: dict[str, Any] = await resp.json()
                return answer

        # A write of its own, so that the revision compacted is past the list's first page.
        put = await call("kv/put", {"key": _b64("gpumon-test/compaction"), "value": _b64("x")})
        revision = int(put["header"]["revision"])
        await call("kv/compaction", {"revision": revision, "physical": True})
        await call("kv/put", {"key": _b64("compact_rev_key"), "value": _b64(str(revision))})
        return revision


class CompactingAfterFirstPage(KubeClient):
    """gpumon's client, recording the informer's list requests; after the first page of the
    first list it compacts etcd and returns that page only once the API server itself refuses
    its continue token."""

    def __init__(self, *args: Any, etcd: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.etcd = etcd
        self.lists: list[dict[str, str]] = []
        self.compacted: int | None = None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Json:
        self.lists.append(dict(params or {}))
        page = await super().get(path, params)
        token = page["metadata"].get("continue")
        if self.compacted is None and token:
            self.compacted = await compact_etcd(self.etcd)
            unrecorded = super().get

            async def refused() -> bool | None:
                try:
                    await unrecorded(path, {**(params or {}), "continue": token})
                except Gone:
                    return True
                return None

            await eventually(refused, what="the API server refuses the compacted continue token")
        return page


async def test_an_expired_continue_token_during_the_initial_list_recovers(
    devcluster: DevCluster, namespace: str, kube: KubeClient
) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    names = {f"cm-{i:02d}" for i in range(OBJECTS)}
    for name in sorted(names):
        await kube.post(path, {"metadata": {"name": name, "labels": {LABEL: "yes"}}})
    errors: list[BaseException] = []
    informer = Informer(
        Selection(path, label_selector=f"{LABEL}=yes"),
        page_size=PAGE,
        on_error=lambda name, e: errors.append(e),
    )
    view = informer.view(lambda o: o["metadata"]["name"], name="configmaps")
    etcd = f"http://127.0.0.1:{devcluster.ports.etcd_client}"
    async with CompactingAfterFirstPage(from_kubeconfig(devcluster.kubeconfig), etcd=etcd) as api:
        task = asyncio.create_task(informer.run(api))

        async def synced() -> bool | None:
            if task.done():
                task.result()  # the wrapper's own failure (NotReached), raised here
            return True if informer.synced.is_set() else None

        try:
            await eventually(synced, what="the informer synced", timeout_seconds=90)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert api.compacted is not None, "the list was never paged: nothing expired"
    assert set(view.items()) == {f"{namespace}/{n}" for n in names}
    # The token expired for real, and the informer heard so from the API server.
    assert [(type(e).__name__, getattr(e, "reason", "")) for e in errors] == [("Gone", "Expired")]
    # Page one, the expired page two, one list without paging: page one was not asked again.
    assert [(p.get("limit"), "continue" in p) for p in api.lists] == [
        (str(PAGE), False),
        (str(PAGE), True),
        (None, False),
    ]
    assert informer.full_lists == 1 and informer.relists == 1

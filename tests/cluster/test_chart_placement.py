"""Where the chart's exporter DaemonSets land, decided by the real DaemonSet controller and
scheduler on kwok nodes: the Linux exporter on Linux GPU nodes only, the Windows (HostProcess)
exporter on Windows nodes that carry the DirectX GPU label of Alibaba Cloud ACK
(``windows.alibabacloud.com/directx-supported=true``, the nodes ACK's
directx-device-plugin-windows runs on; docs/images.md), not on the Linux GPU labels that Windows
nodes do not have."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from gpumon.devcluster import nodes
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpumon"
TEST_LABEL = "gpumon.io/test-placement"
DIRECTX = "windows.alibabacloud.com/directx-supported"


def _render(helm: Path, namespace: str, test_id: str, *, controller: bool = False) -> list[dict[str, Any]]:
    # Only this test's nodes: the session's cluster holds other tests' nodes too.
    own = TEST_LABEL.replace(".", "\\.")
    values = {
        "exporter.windows.enabled": "true",
        "controller.enabled": str(controller).lower(),
        f"exporter.nodeSelector.{own}": test_id,
        f"exporter.windows.nodeSelector.{own}": test_id,
    }
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    out = subprocess.run(
        [str(helm), "template", "place", str(CHART), "--namespace", namespace, *sets],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


async def test_each_exporter_lands_on_its_own_gpu_nodes(
    api: client.ApiClient,
    devcluster: DevCluster,
    helm: Path,
    namespace: str,
    make_nodes: NodeMaker,
    test_id: str,
    tmp_path: Path,
) -> None:
    own = {TEST_LABEL: test_id}
    (linux_gpu,) = await make_nodes(1, nodes.NodeTemplate(gpus=1, labels=own))
    (windows_gpu,) = await make_nodes(
        1, nodes.NodeTemplate(gpus=1, os="windows", labels=own | {DIRECTX: "true"})
    )
    # A Windows GPU node as NFD or the GPU Operator would label a Linux one, without ACK's label.
    await make_nodes(1, nodes.NodeTemplate(gpus=1, os="windows", labels=own))
    await make_nodes(1, nodes.NodeTemplate(gpus=0, labels=own))  # Linux, no GPU

    docs = _render(helm, namespace, test_id)
    manifest = tmp_path / "exporters.yaml"
    manifest.write_text(
        yaml.safe_dump_all([d for d in docs if d["kind"] in ("ServiceAccount", "ConfigMap", "DaemonSet")])
    )
    devcluster.kubectl("apply", "-f", str(manifest))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    async def placed(name: str) -> list[str] | None:
        ds = await apps.read_namespaced_daemon_set(name, namespace)
        status = ds.status
        if status is None or status.observed_generation != ds.metadata.generation:
            return None
        pods = await core.list_namespaced_pod(
            namespace, label_selector=",".join(f"{k}={v}" for k, v in ds.spec.selector.match_labels.items())
        )
        bound = sorted(p.spec.node_name for p in pods.items if p.spec.node_name)
        return bound if len(bound) == status.desired_number_scheduled else None

    assert await eventually(lambda: placed("place-gpumon-exporter"), what="Linux exporter placed") == [
        linux_gpu
    ]
    windows = await eventually(
        lambda: placed("place-gpumon-exporter-windows"), what="Windows exporter placed"
    )
    assert windows == [windows_gpu]
    # The controller's direct signals find both kinds of exporter with the selector it is given.
    (config,) = [
        d
        for d in _render(helm, namespace, test_id, controller=True)
        if d["metadata"]["name"] == "place-gpumon-controller" and d["kind"] == "ConfigMap"
    ]
    selector = yaml.safe_load(config["data"]["controller.yaml"])["signals"]["direct"]["label_selector"]
    found = await core.list_namespaced_pod(namespace, label_selector=selector)
    assert sorted(p.spec.node_name for p in found.items) == sorted([linux_gpu, windows_gpu])

"""Pool declarations (config edge), their frozen values, and views of nodes and /scale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.config import ConfigError, load
from gpumon.config.controller import ControllerConfig
from gpumon.config.pools import PoolConfig
from gpumon.controller.configure import pool_from_config
from gpumon.controller.core.objects import Taint, from_rfc3339
from gpumon.controller.core.pools import ScaleTarget, pool_node_from_json, scale_state
from gpumon.k8s.selectors import Requirement, parse_selector

GPU = "nvidia.com/gpu"


def pool_yaml(**over: Any) -> dict[str, Any]:
    return {
        "name": "h100",
        "target": {"namespace": "capi", "name": "gpu-h100"},
        "node_selector": "cluster.x-k8s.io/deployment-name=gpu-h100",
        "template": {"resources": {GPU: 8, "cpu": "96", "memory": "1Ti"}},
        "max_replicas": 20,
        **over,
    }


def load_pools(tmp_path: Path, *pools: dict[str, Any]) -> ControllerConfig:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"pools": list(pools)}))
    return load(ControllerConfig, config_file=path)


def test_no_pools_by_default() -> None:
    assert ControllerConfig().pools == []


def test_a_pool_from_yaml(tmp_path: Path) -> None:
    cfg = load_pools(
        tmp_path,
        pool_yaml(template={"resources": {GPU: 8}, "taints": [{"key": "gpu", "effect": "NoSchedule"}]}),
    )
    pool = pool_from_config(cfg.pools[0])
    assert pool.target == ScaleTarget(
        "cluster.x-k8s.io", "v1beta2", "MachineDeployment", "machinedeployments", "capi", "gpu-h100"
    )
    assert (
        pool.target.scale_path
        == "/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/machinedeployments/gpu-h100/scale"
    )
    # Its nodes carry the selector's labels, so pods selecting them fit the template.
    assert dict(pool.template.labels) == {"cluster.x-k8s.io/deployment-name": "gpu-h100"}
    assert pool.template.taints == (Taint("gpu", "NoSchedule", None),)
    assert dict(pool.template.resources) == {GPU: 8000}
    assert pool.template.gpu_resources == {GPU}
    assert (pool.min_replicas, pool.max_replicas, pool.max_step) == (None, 20, 10)


@pytest.mark.parametrize(
    ("target", "resource"),
    [
        ({"kind": "MachineSet"}, "machinesets"),
        ({"kind": "MachinePool"}, "machinepools"),
        ({"group": "apps", "version": "v1", "kind": "StatefulSet"}, "statefulsets"),
        ({"group": "example.com", "version": "v1", "kind": "GpuPool", "resource": "gpupoolz"}, "gpupoolz"),
    ],
)
def test_scale_targets(target: dict[str, str], resource: str) -> None:
    pool = pool_from_config(
        PoolConfig.model_validate(pool_yaml(target={"namespace": "ns", "name": "x", **target}))
    )
    assert pool.target.resource == resource
    assert pool.target.path.endswith(f"/namespaces/ns/{resource}/x")


def test_core_group_targets_use_the_core_api_path() -> None:
    t = ScaleTarget("", "v1", "ReplicationController", "replicationcontrollers", "ns", "rc")
    assert t.path == "/api/v1/namespaces/ns/replicationcontrollers/rc" and t.api_version == "v1"
    assert not t.is_cluster_api and str(t) == "ReplicationController ns/rc"


def test_shared_gpu_template_advertises_the_plugin_resources() -> None:
    cfg = pool_yaml(template={"shared_gpus": {"cards": 4, "memory_per_card": 16}})
    pool = pool_from_config(PoolConfig.model_validate(cfg))
    assert dict(pool.template.resources) == {
        "aliyun.com/gpu-mem": 64000,
        "aliyun.com/gpu-count": 4000,
        "aliyun.com/gpu-core.percentage": 400000,
    }
    assert pool.template.shared is not None and pool.template.shared.memory_per_card == 16000


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (pool_yaml(max_replicas=None), "pools.0: Value error, max_replicas is required"),
        (pool_yaml(min_replicas=5, max_replicas=2), "min_replicas must be <= max_replicas"),
        (pool_yaml(node_selector="a b"), "pools.0.node_selector: Value error, bad selector term 'a b'"),
        (pool_yaml(template={"resources": {GPU: "lots"}}), "not a quantity: nvidia.com/gpu='lots'"),
        (pool_yaml(template={"resources": {"cpu": "8"}}), "needs a GPU resource"),
        (pool_yaml(max_step=0), "pools.0.max_step"),
        (pool_yaml(name="Bad_Name"), "pools.0.name"),
        (pool_yaml(target={"namespace": "ns"}), "pools.0.target.name"),
        (pool_yaml(surprise=1), "pools.0.surprise"),
        (
            pool_yaml(
                target={
                    "group": "karpenter.sh",
                    "version": "v1",
                    "kind": "NodePool",
                    "namespace": "n",
                    "name": "gpu",
                }
            ),
            "pools.0.target.group: Value error, karpenter.sh is Karpenter's: gpumon never scales what",
        ),
    ],
)
def test_invalid_pools_name_the_field(tmp_path: Path, pool: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_pools(tmp_path, pool)
    assert message.replace("Value error, ", "") in str(err.value)


def test_pools_and_targets_are_unique(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pool names must be unique"):
        load_pools(tmp_path, pool_yaml(), pool_yaml(target={"namespace": "capi", "name": "other"}))
    with pytest.raises(ConfigError, match="two pools name the same target"):
        load_pools(tmp_path, pool_yaml(), pool_yaml(name="again"))


def test_max_may_come_from_cluster_autoscaler_when_allowed() -> None:
    cfg = PoolConfig.model_validate(pool_yaml(max_replicas=None, allow_cluster_autoscaler=True))
    assert pool_from_config(cfg).max_replicas is None


@pytest.mark.parametrize(
    ("text", "labels", "expressions"),
    [
        ("a=b", {"a": "b"}, ()),
        ("a==b, c!=d", {"a": "b"}, (Requirement("c", "NotIn", frozenset({"d"})),)),
        (
            "e in (f, g),h notin (i),!j,k",
            {},
            (
                Requirement("e", "In", frozenset({"f", "g"})),
                Requirement("h", "NotIn", frozenset({"i"})),
                Requirement("j", "DoesNotExist"),
                Requirement("k", "Exists"),
            ),
        ),
    ],
)
def test_label_selectors(text: str, labels: dict[str, str], expressions: tuple[Requirement, ...]) -> None:
    sel = parse_selector(text)
    assert dict(sel.match_labels) == labels and sel.expressions == expressions


@pytest.mark.parametrize("text", ["", "a b", "a=b,,c", "=x", "a=b=c", "a in b"])
def test_bad_label_selectors(text: str) -> None:
    with pytest.raises(ValueError, match="bad selector term"):
        parse_selector(text)


def test_pool_node_view() -> None:
    template = pool_from_config(PoolConfig.model_validate(pool_yaml())).template
    obj = {
        "metadata": {
            "name": "n0",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"gpumon.io/state": "draining", "gpumon.io/exclude": "true"},
            "annotations": {
                "cluster.x-k8s.io/delete-machine": "yes",
                "cluster.x-k8s.io/machine": "m0",
                "cluster.x-k8s.io/cluster-namespace": "capi",
                "gpumon.io/scale-down-started-at": "2026-01-01T00:01:00Z",
            },
        },
        "spec": {"unschedulable": True},
        "status": {"allocatable": {GPU: "8", "cpu": "96"}},
    }
    n = pool_node_from_json(obj, template)
    assert n.name == "n0" and n.created_at == from_rfc3339("2026-01-01T00:00:00Z")
    assert n.gpus_allocatable and n.quarantined and n.excluded and n.unschedulable and n.marked
    assert n.removing_since == from_rfc3339("2026-01-01T00:01:00Z")
    assert (n.machine, n.machine_namespace) == ("m0", "capi") and not n.deleting
    joining = pool_node_from_json(
        {"metadata": {"name": "n1"}, "status": {"allocatable": {GPU: "0"}}}, template
    )
    assert not joining.gpus_allocatable and not joining.quarantined and joining.removing_since is None


def test_scale_view_reads_an_omitted_zero() -> None:
    s = scale_state(
        {"metadata": {"uid": "u1", "annotations": {"a": "b"}}},
        {"metadata": {"resourceVersion": "42"}, "spec": {}, "status": {"replicas": 1, "selector": "x=y"}},
    )
    assert (s.spec_replicas, s.status_replicas, s.selector, s.resource_version, s.uid) == (
        0,
        1,
        "x=y",
        "42",
        "u1",
    )
    assert dict(s.annotations) == {"a": "b"}

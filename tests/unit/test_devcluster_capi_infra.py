"""The kwok infrastructure provider's decisions (pure) and the Cluster API objects and CRDs the
devcluster builds for Cluster API's manager."""

from __future__ import annotations

from typing import Any

from gpumon.devcluster import capi, cluster_api, nodes
from gpumon.devcluster.capi_infra_plan import (
    CREATED_AT_ANNOTATION,
    MACHINE_NAMESPACE_LABEL,
    plan,
    provider_id,
)

SHAPE = nodes.shape(nodes.NodeTemplate(gpus=8), {"devcluster.gpumon.io/pool": "gpu"})
MACHINE_OWNER = [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "m", "uid": "u"}]


def machine(name: str, *, owned: bool = True, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if owned:
        meta["ownerReferences"] = MACHINE_OWNER
    return {"metadata": meta, "spec": {"node": SHAPE}, "status": status}


def made_node(name: str, namespace: str = "ns") -> dict[str, Any]:
    return nodes.from_shape(
        name,
        SHAPE,
        provider_id=provider_id(namespace, name),
        extra_labels={MACHINE_NAMESPACE_LABEL: namespace},
    )


def test_a_machine_owned_by_a_machine_becomes_a_node_with_its_provider_id() -> None:
    p = plan([machine("gpu-a")], [], {})
    (node,) = p.create_nodes
    assert node["metadata"]["name"] == "gpu-a"
    assert node["spec"]["providerID"] == "kwok://ns/gpu-a"
    assert node["metadata"]["labels"]["devcluster.gpumon.io/pool"] == "gpu"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-a"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    (prov,) = p.provision
    assert (prov.provider_id, prov.set_provider_id, prov.set_provisioned) == ("kwok://ns/gpu-a", True, True)


def test_nothing_is_done_before_a_machine_owns_it() -> None:
    assert plan([machine("gpu-a", owned=False)], [], {}).empty


def test_a_provisioned_machine_with_its_node_needs_nothing() -> None:
    m = machine("gpu-a", initialization={"provisioned": True})
    m["spec"]["providerID"] = "kwok://ns/gpu-a"
    assert plan([m], [made_node("gpu-a")], {}).empty


def test_the_node_of_a_machine_that_is_gone_is_deleted_and_a_deleting_one_is_kept() -> None:
    deleting = machine("gpu-b")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-28T12:00:00Z"
    p = plan([deleting], [made_node("gpu-a"), made_node("gpu-b")], {})
    assert p.delete_nodes == ("gpu-a",)
    assert not p.create_nodes and not p.provision  # a machine being deleted is left to Cluster API


def test_a_same_named_machine_in_another_namespace_is_another_node() -> None:
    p = plan([machine("gpu-a")], [made_node("gpu-a", namespace="other")], {})
    assert [n["spec"]["providerID"] for n in p.create_nodes] == ["kwok://ns/gpu-a"]
    assert p.delete_nodes == ("gpu-a",)


def test_the_cluster_and_control_plane_stand_ins_are_reported_ready_once() -> None:
    fresh = {"metadata": {"name": "c", "namespace": "ns"}}
    initialized = {"initialization": {"controlPlaneInitialized": True}, "externalManagedControlPlane": True}
    done = {"metadata": {"name": "d", "namespace": "ns"}, "status": initialized}
    # The field is the kind's own: the control plane's does not make a KwokCluster provisioned.
    other_kind = {"metadata": {"name": "e", "namespace": "ns"}, "status": initialized}
    p = plan([], [], {capi.KWOK_CONTROL_PLANE: [fresh, done], capi.KWOK_CLUSTER: [other_kind]})
    assert p.make_ready == ((capi.KWOK_CONTROL_PLANE, "ns", "c"), (capi.KWOK_CLUSTER, "ns", "e"))
    # Initialized but not (yet) reported externally managed: reported again, whole.
    half = {
        "metadata": {"name": "f", "namespace": "ns"},
        "status": {"initialization": initialized["initialization"]},
    }
    assert plan([], [], {capi.KWOK_CONTROL_PLANE: [half]}).make_ready == (
        (capi.KWOK_CONTROL_PLANE, "ns", "f"),
    )
    assert capi.KWOK_CONTROL_PLANE.status == initialized


def test_provider_crds_carry_the_contract_label_and_the_contract_fields() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in capi.provider_crds()}
    assert set(crds) == {"KwokMachine", "KwokMachineTemplate", "KwokCluster", "KwokControlPlane"}
    for crd in crds.values():
        assert crd["metadata"]["labels"] == {"cluster.x-k8s.io/v1beta2": "v1alpha1"}
        assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"

    def schema(kind: str) -> dict[str, Any]:
        props: dict[str, Any] = crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        return props

    machine_schema = schema("KwokMachine")
    assert "providerID" in machine_schema["spec"]["properties"]
    assert "provisioned" in machine_schema["status"]["properties"]["initialization"]["properties"]
    assert "spec" in schema("KwokMachineTemplate")["spec"]["properties"]["template"]["properties"]
    plane = schema("KwokControlPlane")["status"]["properties"]["initialization"]["properties"]
    assert "controlPlaneInitialized" in plane
    assert "provisioned" in schema("KwokCluster")["status"]["properties"]["initialization"]["properties"]


def test_managed_objects_carry_the_watch_filter_down_to_the_machines() -> None:
    template, md = capi.machine_pool("gpu", "ns", SHAPE, replicas=2)
    for obj in (template, md):
        assert obj["metadata"]["labels"][capi.WATCH_FILTER_LABEL] == capi.WATCH_FILTER
    assert md["spec"]["template"]["metadata"]["labels"][capi.WATCH_FILTER_LABEL] == capi.WATCH_FILTER
    assert md["spec"]["template"]["spec"]["bootstrap"] == {"dataSecretName": "gpu-bootstrap"}
    ref = md["spec"]["template"]["spec"]["infrastructureRef"]
    assert (ref["apiGroup"], ref["kind"], ref["name"]) == (capi.INFRA_GROUP, template["kind"], "gpu")
    assert template["spec"]["template"]["spec"]["node"] == SHAPE
    kinds = [o["kind"] for o in capi.management_cluster("ns", "kubeconfig: yaml")]
    assert kinds == ["Secret", "KwokCluster", "KwokControlPlane", "Cluster"]


def test_the_manager_webhooks_are_served_on_loopback() -> None:
    crd = {"spec": {"group": "cluster.x-k8s.io", "versions": []}}
    converted = cluster_api.with_conversion_webhook(crd, 9443, b"CA")
    config = converted["spec"]["conversion"]["webhook"]["clientConfig"]
    assert config == {"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}
    assert "conversion" not in crd["spec"]
    hooks = {
        "kind": "ValidatingWebhookConfiguration",
        "webhooks": [
            {"name": "v", "clientConfig": {"service": {"name": "webhook-service", "path": "/validate-x"}}}
        ],
    }
    (hook,) = cluster_api.on_loopback(hooks, 9443, b"CA")["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/validate-x", "caBundle": "Q0E="}
    # Only what the manager reconciles: other tests' inert /scale targets are not defaulted.
    assert hook["objectSelector"] == {"matchLabels": {capi.WATCH_FILTER_LABEL: capi.WATCH_FILTER}}


def delayed(name: str, node_shape: dict[str, Any], seconds: float) -> dict[str, Any]:
    m = machine(name, initialization={"provisioned": True})
    m["spec"] |= {"providerID": f"kwok://ns/{name}", "node": node_shape, "devicesAfterSeconds": seconds}
    return m


def test_a_node_joins_without_its_gpus_and_gets_them_the_delay_later() -> None:
    m = delayed("gpu-a", SHAPE, 3.0)
    (node,) = plan([m], [], {}, now=100.0).create_nodes
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node["status"]["allocatable"]["cpu"] == "96"
    assert node["metadata"]["annotations"][CREATED_AT_ANNOTATION] == "100.0"
    assert plan([m], [node], {}, now=102.9).empty  # the device plugin has not registered yet
    (up,) = plan([m], [node], {}, now=103.0).devices_up
    assert (up.node, dict(up.resources), up.dra) == ("gpu-a", {"nvidia.com/gpu": "8"}, None)
    node["status"]["allocatable"] |= {"nvidia.com/gpu": "8"}
    assert plan([m], [node], {}, now=200.0).empty


def test_a_dra_node_publishes_its_slice_labelled_like_the_node_once_its_delay_is_over() -> None:
    template = nodes.NodeTemplate(gpus=2, dra=True, mig={"3g.40gb": 2})
    shape = nodes.shape(template, {"devcluster.gpumon.io/pool": "dra"})
    assert nodes.dra_template(shape) == nodes.NodeTemplate(
        gpus=2, dra=True, mig={"3g.40gb": 2}, product=template.product
    )
    m = delayed("dra-a", shape, 1.5)
    (node,) = plan([m], [], {}, now=10.0).create_nodes
    assert not nodes.device_resources(node["status"]["allocatable"])
    assert plan([m], [node], {}, now=11.0).empty
    (up,) = plan([m], [node], {}, now=11.5).devices_up
    assert up.dra is not None and up.dra.mig == {"3g.40gb": 2} and not up.resources
    assert up.labels["devcluster.gpumon.io/pool"] == "dra"
    assert up.labels[MACHINE_NAMESPACE_LABEL] == "ns"
    assert plan([m], [node], {}, sliced=["dra-a"], now=20.0).empty
    # Without a delay too, the slice comes once the Node is there (its uid owns the slice).
    (up,) = plan([delayed("dra-a", shape, 0)], [node], {}, now=10.0).devices_up
    assert up.dra is not None

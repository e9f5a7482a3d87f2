"""The local control plane serves what gpumon's DRA support uses (docs/devcluster.md, "Dynamic
Resource Allocation"): resource.k8s.io/v1 for devices, claims and slices, and DeviceTaintRule,
a beta API that v1.36.3 serves only when asked to, with the RBAC that its gate grants the
scheduler and KCM's device-taint-eviction controller."""

from __future__ import annotations

import json

from gpumon.devcluster.cluster import DevCluster, StartupError


def _resources(devcluster: DevCluster, group_version: str) -> dict[str, list[str]]:
    doc = json.loads(devcluster.kubectl("get", "--raw", f"/apis/{group_version}"))
    return {r["name"]: sorted(r["verbs"]) for r in doc["resources"]}


def test_resource_v1_serves_devices_claims_and_slices(devcluster: DevCluster) -> None:
    v1 = _resources(devcluster, "resource.k8s.io/v1")
    for name in ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"):
        assert {"create", "delete", "get", "list", "watch"} <= set(v1[name]), name
    assert "resourceclaims/status" in v1


def test_device_taint_rules_are_served_in_v1beta2_only(devcluster: DevCluster) -> None:
    v1beta2 = _resources(devcluster, "resource.k8s.io/v1beta2")
    # Only the one resource is switched on, not the whole beta group version.
    assert set(v1beta2) == {"devicetaintrules", "devicetaintrules/status"}, v1beta2
    assert {"create", "get", "list", "watch"} <= set(v1beta2["devicetaintrules"])
    groups = json.loads(devcluster.kubectl("get", "--raw", "/apis/resource.k8s.io"))
    served = {v["version"] for v in groups["versions"]}
    assert served == {"v1", "v1beta2"}, served
    assert groups["preferredVersion"]["version"] == "v1"


def test_the_gate_grants_scheduler_and_eviction_controller_the_rules(devcluster: DevCluster) -> None:
    def can(verb: str, resource: str, who: str, *subresource: str) -> bool:
        try:  # kubectl answers "no" with exit code 1
            return (
                devcluster.kubectl("auth", "can-i", verb, resource, *subresource, f"--as={who}").strip()
                == "yes"
            )
        except StartupError as e:
            assert "no" in str(e), e
            return False

    taint_controller = "system:serviceaccount:kube-system:device-taint-eviction-controller"
    assert can("watch", "devicetaintrules.resource.k8s.io", "system:kube-scheduler")
    assert can("watch", "devicetaintrules.resource.k8s.io", taint_controller)
    assert can("patch", "devicetaintrules.resource.k8s.io", taint_controller, "--subresource=status")
    # and the check can say no: the scheduler may not write the rules
    assert not can("create", "devicetaintrules.resource.k8s.io", "system:kube-scheduler")

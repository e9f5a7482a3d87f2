"""The Helm chart (deploy/helm/gpumon), with helm built from its Go module and the real local
control plane:

- ``helm lint --strict`` passes with the defaults and with every optional part on;
- bad values fail at template time with a message naming the value (values.schema.json);
- every rendered object passes the API server's server-side dry-run (CRDs installed);
- the exporter's and the controller's RBAC, applied for real, grant what each needs and
  nothing they must not have, as ``kubectl auth can-i`` answers for their service accounts;
- the PrometheusRule carries exactly the groups of alerts/gpumon.rules.yml.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import render

from gpumon.config import ExporterConfig, HealthConfig, load
from gpumon.config.controller import ControllerConfig
from gpumon.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpumon"
EVERYTHING = {
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
    "grafanaDashboards.enabled": "true",
    "prometheusAdapter.rulesConfigMap.enabled": "true",
    "exporter.windows.enabled": "true",
}
# The security settings (the Windows exporter refuses them): TLS from a Secret with a bearer
# token, cert-manager with Kubernetes-delegated auth, basic auth.
SECURED = {
    "tls-secret-bearer": {
        "monitoring.serviceMonitor.enabled": "true",
        "tls.enabled": "true",
        "tls.secretName": "gpumon-tls",
        "tls.caSecretName": "gpumon-ca",
        "auth.mode": "bearer",
        "auth.secretName": "gpumon-scrape",
    },
    "cert-manager-kubernetes": {
        "monitoring.serviceMonitor.enabled": "true",
        "tls.enabled": "true",
        "tls.certManager.enabled": "true",
        "tls.certManager.issuerRef.name": "gpumon-ca",
        "tls.certManager.issuerRef.kind": "ClusterIssuer",
        "auth.mode": "kubernetes",
        "auth.kubernetes.metricsReaderRole.subjects[0].kind": "ServiceAccount",
        "auth.kubernetes.metricsReaderRole.subjects[0].name": "prometheus-k8s",
        "auth.kubernetes.metricsReaderRole.subjects[0].namespace": "monitoring",
        "exporter.podAttribution.enabled": "false",
    },
    "basic": {"monitoring.serviceMonitor.enabled": "true", "auth.mode": "basic", "auth.secretName": "s"},
}
VALUE_SETS = {"defaults": {}, "everything": EVERYTHING, **SECURED}


def _run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, f"{' '.join(map(str, argv))}:\n{result.stdout}\n{result.stderr}"
    return result


def _sets(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def _template(helm: Path, release: str, namespace: str, values: dict[str, str]) -> list[dict[str, Any]]:
    return render(helm, values, release=release, namespace=namespace)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_passes(helm: Path, values: dict[str, str]) -> None:
    result = _run(helm, "lint", "--strict", CHART, *_sets(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("controller.replicas", "two", "at '/controller/replicas': got string, want integer"),
        ("exporter.metricsProfile", "dcgmm", "at '/exporter/metricsProfile': value must be one of"),
        ("exporter.podAtribution.enabled", "false", "additional properties 'podAtribution' not allowed"),
        ("monitoring.serviceMonitor.interval", "often", "at '/monitoring/serviceMonitor/interval'"),
        # Misspelt keys, at every depth.
        ("tls.enabeld", "true", "at '/tls': additional properties 'enabeld' not allowed"),
        (
            "tls.certManager.issuerRef.nmae",
            "ca",
            "at '/tls/certManager/issuerRef': additional properties 'nmae'",
        ),
        (
            "auth.kubernetes.cacheTTL",
            "5",
            "at '/auth/kubernetes': additional properties 'cacheTTL' not allowed",
        ),
        (
            "networkPolicy.scrapers[0].podSelector.matchLabel.app",
            "prom",
            "at '/networkPolicy/scrapers/0/podSelector': additional properties 'matchLabel' not allowed",
        ),
        (
            "exporter.resources.requests.cpuu",
            "1",
            "at '/exporter/resources/requests': additional properties 'cpuu'",
        ),
        (
            "auth.kubernetes.metricsReaderRole.subjects[0].nmae",
            "prom",
            "at '/auth/kubernetes/metricsReaderRole/subjects/0'",
        ),
        # Mistyped values, at every depth.
        ("tls.enabled", "yes", "at '/tls/enabled': got string, want boolean"),
        (
            "auth.mode",
            "token",
            "at '/auth/mode': value must be one of 'none', 'bearer', 'basic', 'kubernetes'",
        ),
        (
            "auth.kubernetes.cacheTTLSeconds",
            "soon",
            "at '/auth/kubernetes/cacheTTLSeconds': got string, want integer",
        ),
        (
            "tls.certManager.issuerRef.kind",
            "Issuers",
            "at '/tls/certManager/issuerRef/kind': value must be one of",
        ),
        ("tls.certManager.duration", "90 days", "at '/tls/certManager/duration'"),
        (
            "networkPolicy.scrapers[0].ipBlock.cidr",
            "7",
            "at '/networkPolicy/scrapers/0/ipBlock/cidr': got number, want string",
        ),
        ("networkPolicy.enabled", "on", "at '/networkPolicy/enabled': got string, want boolean"),
        (
            "exporter.server.headerTimeoutSeconds",
            "0",
            "at '/exporter/server/headerTimeoutSeconds': exclusiveMinimum",
        ),
        (
            "controller.server.maxConnections",
            "many",
            "at '/controller/server/maxConnections': got string, want integer",
        ),
        (
            "exporter.server.maxConnnections",
            "9",
            "at '/exporter/server': additional properties 'maxConnnections'",
        ),
        ("health.temperature", "90", "at '/health': additional properties 'temperature'"),
        # One judgement of a GPU: the programs' own health sections are the top-level value's.
        (
            "exporter.config.health.xid_window_seconds",
            "30",
            "exporter.config.health: set the top-level value `health` instead",
        ),
        (
            "controller.config.policy.health.xid_window_seconds",
            "30",
            "controller.config.policy.health: set the top-level value `health` instead",
        ),
        # What a mode needs.
        ("auth.mode", "bearer", "at '/auth/secretName': minLength: got 0, want 1"),
        ("tls.certManager.enabled", "true", "at '/tls/certManager/issuerRef/name': minLength: got 0, want 1"),
    ],
)
def test_bad_values_fail_with_a_message_naming_them(helm: Path, key: str, value: str, message: str) -> None:
    result = _run(helm, "template", "bad", CHART, "--set", f"{key}={value}", check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_prometheus_rule_is_the_rules_file(helm: Path) -> None:
    docs = _template(helm, "rules", "monitoring", {"monitoring.prometheusRule.enabled": "true"})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((REPO / "alerts" / "gpumon.rules.yml").read_text())


@pytest.mark.parametrize(
    "values",
    [{}, {**EVERYTHING, "controller.drainEscalationDelete": "true"}, *SECURED.values()],
    ids=["defaults", "everything", *SECURED],
)
def test_rendered_settings_load_in_gpumon(helm: Path, values: dict[str, str], tmp_path: Path) -> None:
    """The ConfigMaps the chart renders are configurations the exporter and controller accept."""
    rendered = _template(helm, "cfg", "gpumon", values)
    docs = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "ConfigMap"}
    exporter_file = tmp_path / "exporter.yaml"
    exporter_file.write_text(docs["cfg-gpumon-exporter"]["data"]["exporter.yaml"])
    # Plain JSON (which is YAML), so the exporter reads it without importing yaml (~0.7 MiB).
    json.loads(exporter_file.read_text())
    exporter = load(ExporterConfig, config_file=exporter_file)
    attribution = values.get("exporter.podAttribution.enabled") != "false"
    assert exporter.pods.enabled == attribution
    assert not attribution or exporter.pods.host_proc == Path("/host/proc")
    assert exporter.auth.mode == ("kubernetes" if values.get("auth.mode") == "kubernetes" else "static")
    assert (exporter.tls.cert_file is not None) == (values.get("tls.enabled") == "true")
    controller_file = tmp_path / "controller.yaml"
    controller_file.write_text(docs["cfg-gpumon-controller"]["data"]["controller.yaml"])
    controller = load(ControllerConfig, config_file=controller_file)
    assert controller.dry_run
    assert controller.state_configmap == controller.leader.lease_name == "cfg-gpumon-controller"
    assert controller.signals.direct.label_selector == (
        "app.kubernetes.io/instance=cfg,app.kubernetes.io/component in (exporter,exporter-windows)"
    )
    escalating = values.get("controller.drainEscalationDelete") == "true"
    assert controller.drain.escalation == ("delete" if escalating else "report")
    (role,) = [
        d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "cfg-gpumon-controller"
    ]
    deletes_pods = any("pods" in r.get("resources", ()) and "delete" in r["verbs"] for r in role["rules"])
    assert deletes_pods == escalating


def test_one_health_value_judges_alike_in_every_program(
    helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's `health` is each exporter's verdict and the controller's rules: loaded as the
    programs load their settings, all three hold the same policy, and the controller's thermal
    rules fire at its thresholds."""
    section = {
        "xid_overrides": {"13": "unhealthy", "79": "healthy"},
        "unknown_xid_state": "unhealthy",
        "xid_window_seconds": 30,
        "temperature_degraded_celsius": 80,
        "temperature_unhealthy_celsius": 90,
    }
    rendered = render(helm, {"health": section, "exporter.windows.enabled": "true"}, release="h")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    exporter_file = tmp_path / "exporter.yaml"
    exporter_file.write_text(docs["ConfigMap", "h-gpumon-exporter"]["data"]["exporter.yaml"])
    controller_file = tmp_path / "controller.yaml"
    controller_file.write_text(docs["ConfigMap", "h-gpumon-controller"]["data"]["controller.yaml"])
    windows = docs["DaemonSet", "h-gpumon-exporter-windows"]["spec"]["template"]["spec"]["containers"][0]
    for e in windows["env"]:
        if e["name"].startswith("GPUMON_"):
            monkeypatch.setenv(e["name"], e["value"])
    windows_health = load(ExporterConfig).health.policy()
    for e in windows["env"]:
        monkeypatch.delenv(e["name"], raising=False)
    exporter_health = load(ExporterConfig, config_file=exporter_file).health.policy()
    controller = load(ControllerConfig, config_file=controller_file)
    assert exporter_health == windows_health == controller.policy.health.policy()
    assert exporter_health == HealthConfig.model_validate(section).policy()
    thresholds = {r.name: r.threshold for r in controller.policy.effective_rules if r.signal == "temperature"}
    assert thresholds == {"thermal-unhealthy": 90.0, "thermal-degraded": 80.0}


@pytest.mark.parametrize("values", [EVERYTHING, *SECURED.values()], ids=["everything", *SECURED])
def test_rendered_objects_pass_server_side_dry_run(
    helm: Path, devcluster: DevCluster, namespace: str, tmp_path: Path, values: dict[str, str]
) -> None:
    docs = _template(helm, "dry", namespace, values)
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ServiceMonitor", "ClusterRole", "Role", "NetworkPolicy"} <= kinds
    if values.get("tls.certManager.enabled") == "true":
        assert "Certificate" in kinds
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    out = _kubectl(
        devcluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=gpumon-test",
        "-f",
        str(rendered),
    ).stdout
    assert out.count("(server dry run)") == len(docs), out


def _kubectl(devcluster: DevCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(devcluster.tools.kubectl, f"--kubeconfig={devcluster.kubeconfig}", *args, check=check)


# One pool is enough to make the chart render the autoscaler's rights.
WITH_POOL = {
    "controller.config.pools[0].name": "a100",
    "controller.config.pools[0].target.kind": "MachineDeployment",
    "controller.config.pools[0].target.name": "a100",
}


@contextlib.contextmanager
def _rbac_applied(
    helm: Path, devcluster: DevCluster, namespace: str, release: str, values: dict[str, str], tmp_path: Path
) -> Iterator[str]:
    """The chart's service accounts and RBAC (no workloads) applied for real; the release name."""
    docs = [
        d
        for d in _template(helm, release, namespace, values)
        if d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    ]
    manifest = tmp_path / f"rbac-{release}.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    _kubectl(devcluster, "apply", "--server-side", "--field-manager=gpumon-test", "-f", str(manifest))
    try:
        yield release
    finally:
        _kubectl(devcluster, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest), check=False)


@pytest.fixture
def installed_rbac(
    helm: Path, devcluster: DevCluster, namespace: str, test_id: str, tmp_path: Path
) -> Iterator[str]:
    # test_id ends in random hex; short keeps names within 63
    release = f"r{test_id[-6:]}"
    with _rbac_applied(helm, devcluster, namespace, release, EVERYTHING | WITH_POOL, tmp_path):
        yield release


def _can(devcluster: DevCluster, account: str, namespace: str, verb: str, resource: str, *extra: str) -> bool:
    result = _kubectl(
        devcluster,
        "auth",
        "can-i",
        verb,
        resource,
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:{account}",
        *extra,
        check=False,
    )
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def _review(
    devcluster: DevCluster,
    account: str,
    namespace: str,
    verb: str,
    group: str,
    resource: str,
    *,
    subresource: str = "",
) -> bool:
    """A SubjectAccessReview, for a resource whose CRD the local control plane does not serve
    (``kubectl auth can-i`` needs discovery to find a resource's group; Machine's CRD is not
    installed there)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "subresource": subresource,
                "namespace": namespace,
            },
        },
    }
    result = subprocess.run(
        [
            str(devcluster.tools.kubectl),
            f"--kubeconfig={devcluster.kubeconfig}",
            "create",
            "-f",
            "-",
            "-o",
            "jsonpath={.status.allowed}",
        ],
        input=yaml.safe_dump(review),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "true"


def test_controller_rbac_is_what_it_needs_and_no_more(
    devcluster: DevCluster, namespace: str, installed_rbac: str
) -> None:
    sa = f"{installed_rbac}-gpumon-controller"
    need = [
        ("get", "nodes"),
        ("list", "nodes"),
        ("watch", "nodes"),
        ("patch", "nodes"),
        ("patch", "nodes", "--subresource=status"),
        ("list", "pods"),
        ("watch", "pods"),
        ("create", "pods", "--subresource=eviction"),
        ("list", "poddisruptionbudgets.policy"),
        ("list", "resourceclaims.resource.k8s.io"),
        ("watch", "resourceclaims.resource.k8s.io"),
        ("list", "resourceslices.resource.k8s.io"),
        ("watch", "resourceslices.resource.k8s.io"),
        ("create", "events"),
        ("create", "leases.coordination.k8s.io"),
        ("update", f"leases.coordination.k8s.io/{sa}"),
        ("get", f"configmaps/{sa}"),
        ("patch", f"configmaps/{sa}"),
        ("get", "machinedeployments.cluster.x-k8s.io"),
        ("patch", "machinedeployments.cluster.x-k8s.io"),
        ("patch", "machinedeployments.cluster.x-k8s.io", "--subresource=scale"),
    ]
    must_not = [
        ("delete", "pods"),
        ("create", "pods"),
        ("delete", "nodes"),
        ("update", "nodes"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("get", "configmaps/someone-elses"),
        ("update", "leases.coordination.k8s.io/other"),
        ("delete", "machinedeployments.cluster.x-k8s.io"),
        ("patch", "deployments.apps"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("create", "serviceaccounts", "--subresource=token"),
        ("update", "resourceclaims.resource.k8s.io"),
        ("create", "resourceslices.resource.k8s.io"),
    ]
    assert [c for c in need if not _can(devcluster, sa, namespace, *c)] == []
    assert [c for c in must_not if _can(devcluster, sa, namespace, *c)] == []
    # DRA device taints: reviewed by group and resource, which kubectl's discovery would not
    # resolve where the API server does not serve them (their gate is off by default).
    for verb in ("list", "watch", "create", "delete"):
        assert _review(devcluster, sa, namespace, verb, "resource.k8s.io", "devicetaintrules"), verb
    assert not _review(devcluster, sa, namespace, "update", "resource.k8s.io", "devicetaintrules")
    # Its Lease and ConfigMap live in its own namespace only.
    assert not _can(devcluster, sa, "default", "create", "leases.coordination.k8s.io")
    # Machines: marked for deletion on scale-down, never read or deleted by the controller.
    assert _review(devcluster, sa, namespace, "patch", "cluster.x-k8s.io", "machines")
    assert not _review(devcluster, sa, namespace, "delete", "cluster.x-k8s.io", "machines")
    assert not _review(devcluster, sa, namespace, "get", "cluster.x-k8s.io", "machines")


def test_without_pools_the_controller_has_no_cluster_api_rights(
    helm: Path, devcluster: DevCluster, namespace: str, test_id: str, tmp_path: Path
) -> None:
    with _rbac_applied(helm, devcluster, namespace, f"n{test_id[-6:]}", EVERYTHING, tmp_path) as release:
        sa = f"{release}-gpumon-controller"
        assert _can(devcluster, sa, namespace, "patch", "nodes"), "the rest of its rights stay"
        kinds = ("machinedeployments", "machinesets", "machinepools", "machines")
        allowed = [
            (verb, kind, sub)
            for verb in ("get", "patch")
            for kind in kinds
            for sub in ("", "scale")
            if _review(devcluster, sa, namespace, verb, "cluster.x-k8s.io", kind, subresource=sub)
        ]
        assert allowed == []


def test_exporter_rbac_reads_pods_and_resource_slices_and_nothing_else(
    devcluster: DevCluster, namespace: str, installed_rbac: str
) -> None:
    sa = f"{installed_rbac}-gpumon-exporter"
    for resource in ("pods", "resourceslices.resource.k8s.io"):
        assert all(_can(devcluster, sa, namespace, verb, resource) for verb in ("get", "list", "watch"))
    must_not = [
        ("create", "resourceslices.resource.k8s.io"),
        ("list", "resourceclaims.resource.k8s.io"),
        ("patch", "nodes"),
        ("list", "nodes"),
        ("create", "pods", "--subresource=eviction"),
        ("delete", "pods"),
        ("get", "secrets"),
        ("create", "events"),
        ("get", "configmaps"),
    ]
    assert [c for c in must_not if _can(devcluster, sa, namespace, *c)] == []
    windows = f"{installed_rbac}-gpumon-exporter-windows"
    assert not _can(devcluster, windows, namespace, "list", "pods")


def test_kubernetes_auth_rbac(
    helm: Path, devcluster: DevCluster, namespace: str, test_id: str, tmp_path: Path
) -> None:
    """auth.mode kubernetes: both programs may ask for reviews, the scrapers bound to the
    metrics-reader role may get /metrics and nothing more, the controller may read exporters."""
    release = f"k{test_id[-6:]}"
    values = {
        **SECURED["cert-manager-kubernetes"],
        "auth.kubernetes.metricsReaderRole.subjects[0].namespace": namespace,
    }
    docs = [
        d
        for d in _template(helm, release, namespace, values)
        if d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    ]
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "prometheus-k8s", "namespace": namespace},
        }
    )
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    _kubectl(devcluster, "apply", "--server-side", "--field-manager=gpumon-test", "-f", str(manifest))
    try:
        for program in ("exporter", "controller"):
            sa = f"{release}-gpumon-{program}"
            for review in ("tokenreviews.authentication.k8s.io", "subjectaccessreviews.authorization.k8s.io"):
                assert _can(devcluster, sa, namespace, "create", review), (sa, review)
        controller = f"{release}-gpumon-controller"
        # The exporter's /api/v1/... is reviewed as /gpumon/api/v1/... (every authenticated
        # user may get /api/*, the API server's discovery).
        assert _can(devcluster, controller, namespace, "get", "/gpumon/api/v1/watch")
        assert _can(devcluster, controller, namespace, "get", "/gpumon/api/v1/snapshot")
        # `gpumon doctor` in the exporter's pod reads the snapshot as the exporter's account.
        exporter = f"{release}-gpumon-exporter"
        assert _can(devcluster, exporter, namespace, "get", "/gpumon/api/v1/snapshot")
        assert not _can(devcluster, exporter, namespace, "get", "/gpumon/api/v1/watch")
        assert _can(devcluster, "prometheus-k8s", namespace, "get", "/metrics")
        assert not _can(devcluster, "prometheus-k8s", namespace, "get", "/gpumon/api/v1/snapshot")
        assert _can(devcluster, "prometheus-k8s", namespace, "get", "/api/v1/snapshot")
        assert not _can(devcluster, "prometheus-k8s", namespace, "list", "pods")
        assert not _can(devcluster, "default", namespace, "get", "/metrics")
    finally:
        _kubectl(devcluster, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest), check=False)

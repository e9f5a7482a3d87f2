"""Every value in the chart's values.yaml does something, and the security settings render what
docs/security.md says (helm template only; tests/cluster/test_helm_chart.py applies the
renders to the API server and checks the RBAC with it).

- each leaf of values.yaml is in ``CHANGES`` (a test fails for one that is not), and setting it
  changes the rendered manifests;
- TLS from a Secret or cert-manager, bearer/basic/kubernetes auth: the programs' settings, the
  mounts and environment, the probes' scheme and each ServiceMonitor's scheme, tlsConfig and
  credentials;
- the NetworkPolicies and every container's securityContext.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, render

from gpumon.config.controller import ControllerConfig

SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

Values = dict[str, Any]

TLS_SECRET: Values = {"tls.enabled": True, "tls.secretName": "gpumon-tls"}
CERT_MANAGER: Values = {
    "tls.enabled": True,
    "tls.certManager.enabled": True,
    "tls.certManager.issuerRef.name": "gpumon-ca",
}
BEARER: Values = {"auth.mode": "bearer", "auth.secretName": "gpumon-scrape"}
BASIC: Values = {"auth.mode": "basic", "auth.secretName": "gpumon-scrape"}
KUBERNETES: Values = {"auth.mode": "kubernetes"}
MONITORED: Values = {"monitoring.serviceMonitor.enabled": True}
PROMETHEUS_SA = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}

# Each leaf of values.yaml: a value other than its default, and what must be set for it to
# matter. Free-form maps (nodeSelector, labels, config, resources, ...) are leaves.
# A pool that repairs: what the repair Jobs' values are rendered into.
REPAIRING: Values = {
    "controller.config": {
        "pools": [
            {
                "name": "h100",
                "target": {"namespace": "capi", "name": "gpu-h100"},
                "node_selector": "pool=h100",
                "template": {"resources": {"nvidia.com/gpu": 8}},
                "max_replicas": 4,
                "repair": {"steps": ["reset", "reboot"]},
            }
        ]
    }
}
CHANGES: dict[str, tuple[Any, Values]] = {
    "image.repository": ("registry.example/gpumon", {}),
    "image.tag": ("1.2.3", {}),
    "image.pullPolicy": ("Always", {}),
    "imagePullSecrets": ([{"name": "pull"}], {}),
    "nameOverride": ("gm", {}),
    "fullnameOverride": ("fleet", {}),
    "exporter.enabled": (False, {}),
    "exporter.port": (9999, {}),
    "exporter.metricsProfile": ("dcgm", {}),
    "exporter.logFormat": ("text", {}),
    "exporter.gpuNodeLabels": (["gpu"], {}),
    "exporter.nodeSelector": ({"pool": "gpu"}, {}),
    "exporter.tolerations": ([], {}),
    "exporter.podAttribution.enabled": (False, {}),
    "exporter.podAttribution.podResourcesDir": ("/run/kubelet/pod-resources", {}),
    "exporter.runtimeClassName": ("nvidia", {}),
    "exporter.priorityClassName": ("", {}),
    "exporter.resources": ({"limits": {"memory": "1Gi"}}, {}),
    "exporter.config": ({"sampling": {"fast_interval_seconds": 2}}, {}),
    "exporter.podAnnotations": ({"a": "b"}, {}),
    "exporter.server.headerTimeoutSeconds": (2.5, {}),
    "exporter.server.idleTimeoutSeconds": (30, {}),
    "exporter.server.maxConnections": (64, {}),
    "exporter.windows.enabled": (True, {}),
    "exporter.windows.image.repository": ("registry.example/win", {"exporter.windows.enabled": True}),
    "exporter.windows.image.tag": ("1.2.3", {"exporter.windows.enabled": True}),
    "exporter.windows.nodeSelector": ({"pool": "win"}, {"exporter.windows.enabled": True}),
    "exporter.windows.resources": ({"limits": {"memory": "1Gi"}}, {"exporter.windows.enabled": True}),
    "health": ({"temperature_unhealthy_celsius": 90}, {}),
    "controller.enabled": (False, {}),
    "controller.replicas": (1, {}),
    "controller.dryRun": (False, {}),
    "controller.port": (9999, {}),
    "controller.logFormat": ("text", {}),
    "controller.drainEscalationDelete": (True, {}),
    "controller.config": ({"breaker": {"min_nodes": 3}}, {}),
    "controller.resources": ({"limits": {"memory": "1Gi"}}, {}),
    "controller.nodeSelector": ({"pool": "system"}, {}),
    "controller.tolerations": ([{"key": "system", "operator": "Exists"}], {}),
    "controller.podAnnotations": ({"a": "b"}, {}),
    "controller.server.headerTimeoutSeconds": (2.5, {}),
    "controller.server.idleTimeoutSeconds": (30, {}),
    "controller.server.maxConnections": (64, {}),
    **{
        f"controller.repairJobs.{step}.spec.{key}": (value, REPAIRING)
        for step in ("reset", "reboot")
        for key, value in (("hostPID", False), ("containers", [{"name": "mine", "image": "mine:1"}]))
    },
    "tls.enabled": (True, {"tls.secretName": "gpumon-tls"}),
    "tls.secretName": ("other", {"tls.enabled": True, "tls.secretName": "gpumon-tls"}),
    "tls.certManager.enabled": (True, {**TLS_SECRET, "tls.certManager.issuerRef.name": "ca"}),
    "tls.certManager.issuerRef.name": ("other", CERT_MANAGER),
    "tls.certManager.issuerRef.kind": ("ClusterIssuer", CERT_MANAGER),
    "tls.certManager.duration": ("720h", CERT_MANAGER),
    "tls.certManager.renewBefore": ("48h", CERT_MANAGER),
    "tls.caSecretName": ("exporter-ca", TLS_SECRET),
    "auth.mode": ("kubernetes", {}),
    "auth.secretName": ("other", BEARER),
    "auth.kubernetes.cacheTTLSeconds": (60, KUBERNETES),
    "auth.kubernetes.metricsReaderRole.enabled": (False, KUBERNETES),
    "auth.kubernetes.metricsReaderRole.subjects": ([PROMETHEUS_SA], KUBERNETES),
    "networkPolicy.enabled": (False, {}),
    "networkPolicy.scrapers": ([{"ipBlock": {"cidr": "10.0.0.0/8"}}], {}),
    "monitoring.serviceMonitor.enabled": (True, {}),
    "monitoring.serviceMonitor.interval": ("30s", MONITORED),
    "monitoring.serviceMonitor.labels": ({"release": "prom"}, MONITORED),
    "monitoring.prometheusRule.enabled": (True, {}),
    "monitoring.prometheusRule.labels": ({"release": "prom"}, {"monitoring.prometheusRule.enabled": True}),
    "monitoring.prometheusRule.runbookBaseURL": (
        "https://example.com/gpumon",
        {"monitoring.prometheusRule.enabled": True},
    ),
    "grafanaDashboards.enabled": (True, {}),
    "grafanaDashboards.labels": ({"dash": "yes"}, {"grafanaDashboards.enabled": True}),
    "grafanaDashboards.annotations": ({"folder": "GPU"}, {"grafanaDashboards.enabled": True}),
    "prometheusAdapter.rulesConfigMap.enabled": (True, {}),
}
_FREE_FORM = {"nodeSelector", "podAnnotations", "labels", "annotations", "config", "resources"}


def _leaves(values: Values, prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in _FREE_FORM:
            out += _leaves(value, path + ".")
        else:
            out.append(path)
    return out


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def config_of(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    cm = one(docs, "ConfigMap", f"r-gpumon-{component}")
    loaded: dict[str, Any] = yaml.safe_load(cm["data"][f"{component}.yaml"])
    return loaded


def container(docs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    c: dict[str, Any] = one(docs, kind, f"r-gpumon-{component}")["spec"]["template"]["spec"]["containers"][0]
    return c


def test_every_value_is_in_the_table() -> None:
    leaves = _leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert sorted(set(leaves) - set(CHANGES)) == [], "values with no render test: add them to CHANGES"
    assert sorted(set(CHANGES) - set(leaves)) == [], "CHANGES names values that values.yaml lacks"


@pytest.mark.parametrize("path", sorted(CHANGES))
def test_every_value_changes_the_render(helm: Path, path: str) -> None:
    value, needs = CHANGES[path]
    assert render(helm, {**needs, path: value}) != render(helm, needs)


def test_server_limits_reach_each_program_and_the_windows_exporter(helm: Path) -> None:
    limits = {"headerTimeoutSeconds": 2.5, "idleTimeoutSeconds": 30, "maxConnections": 64}
    docs = render(helm, {"exporter.server": limits, "exporter.windows.enabled": True})
    expected = {"header_timeout_seconds": 2.5, "idle_timeout_seconds": 30, "max_connections": 64}
    assert config_of(docs, "exporter")["server"] == expected
    assert config_of(docs, "controller")["server"] == {
        "header_timeout_seconds": 10,
        "idle_timeout_seconds": 75,
        "max_connections": 256,
    }, "each program has its own limits; the controller's are its defaults"
    env = {e["name"]: e.get("value") for e in container(docs, "DaemonSet", "exporter-windows")["env"]}
    assert {k: v for k, v in env.items() if k.startswith("GPUMON_SERVER__")} == {
        "GPUMON_SERVER__HEADER_TIMEOUT_SECONDS": "2.5",
        "GPUMON_SERVER__IDLE_TIMEOUT_SECONDS": "30",
        "GPUMON_SERVER__MAX_CONNECTIONS": "64",
    }
    controller = render(helm, {"controller.server": {**limits, "maxConnections": 8}})
    assert config_of(controller, "controller")["server"] == {**expected, "max_connections": 8}


def test_health_reaches_every_program_from_the_one_value(helm: Path) -> None:
    section = {"xid_overrides": {"13": "unhealthy"}, "temperature_unhealthy_celsius": 90}
    docs = render(helm, {"health": section, "exporter.windows.enabled": True})
    assert config_of(docs, "exporter")["health"] == section
    assert config_of(docs, "controller")["policy"]["health"] == section
    env = {e["name"]: e.get("value") for e in container(docs, "DaemonSet", "exporter-windows")["env"]}
    assert yaml.safe_load(env["GPUMON_HEALTH"]) == section
    policy = render(helm, {"health": section, "controller.config": {"policy": {"flap_max_onsets": 5}}})
    assert config_of(policy, "controller")["policy"] == {"health": section, "flap_max_onsets": 5}


# -- TLS ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["secret", "cert-manager"])
def test_tls_reaches_both_programs_their_probes_and_the_service_monitors(helm: Path, source: str) -> None:
    values = {**(TLS_SECRET if source == "secret" else CERT_MANAGER), **MONITORED}
    docs = render(helm, values)
    secret = "gpumon-tls" if source == "secret" else "r-gpumon-tls"
    tls = {"cert_file": "/var/run/gpumon/tls/tls.crt", "key_file": "/var/run/gpumon/tls/tls.key"}
    for kind, component in (("DaemonSet", "exporter"), ("Deployment", "controller")):
        assert config_of(docs, component)["tls"] == tls
        c = container(docs, kind, component)
        assert {"name": "tls", "mountPath": "/var/run/gpumon/tls", "readOnly": True} in c["volumeMounts"]
        assert c["livenessProbe"]["httpGet"]["scheme"] == c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        volumes = one(docs, kind, f"r-gpumon-{component}")["spec"]["template"]["spec"]["volumes"]
        assert {"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440}} in volumes
        endpoint = one(docs, "ServiceMonitor", f"r-gpumon-{component}")["spec"]["endpoints"][0]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == {
            "ca": {"secret": {"name": secret, "key": "ca.crt"}},
            "serverName": f"r-gpumon-{component}.gpumon.svc",
        }
    direct = config_of(docs, "controller")["signals"]["direct"]
    assert (direct["scheme"], direct["ca_file"], direct["server_name"]) == (
        "https",
        "/var/run/gpumon/tls/ca.crt",
        "r-gpumon-exporter.gpumon.svc",
    )
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    if source == "secret":
        assert certificates == []
        return
    (cert,) = certificates
    assert cert["spec"]["secretName"] == secret
    assert cert["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": "gpumon-ca"}
    for service in ("r-gpumon-exporter", "r-gpumon-controller"):
        assert f"{service}.gpumon.svc" in cert["spec"]["dnsNames"]


def test_a_separate_ca_is_what_the_controller_and_prometheus_trust(helm: Path) -> None:
    docs = render(helm, {**TLS_SECRET, **MONITORED, "tls.caSecretName": "exporter-ca"})
    assert (
        config_of(docs, "controller")["signals"]["direct"]["ca_file"] == "/var/run/gpumon/exporter-ca/ca.crt"
    )
    mounts = container(docs, "Deployment", "controller")["volumeMounts"]
    assert {"name": "exporter-ca", "mountPath": "/var/run/gpumon/exporter-ca", "readOnly": True} in mounts
    endpoint = one(docs, "ServiceMonitor", "r-gpumon-exporter")["spec"]["endpoints"][0]
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "exporter-ca", "key": "ca.crt"}}


# -- auth -----------------------------------------------------------------------------------------


def test_bearer_token_from_a_secret(helm: Path) -> None:
    docs = render(helm, {**BEARER, **MONITORED})
    for kind, component in (("DaemonSet", "exporter"), ("Deployment", "controller")):
        assert config_of(docs, component)["auth"] == {"bearer_token_file": "/var/run/gpumon/auth/token"}
        assert {"name": "auth", "mountPath": "/var/run/gpumon/auth", "readOnly": True} in container(
            docs, kind, component
        )["volumeMounts"]
        endpoint = one(docs, "ServiceMonitor", f"r-gpumon-{component}")["spec"]["endpoints"][0]
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": "gpumon-scrape", "key": "token"},
        }
    # The controller sends the same token to the exporters.
    direct = config_of(docs, "controller")["signals"]["direct"]
    assert direct["bearer_token_file"] == "/var/run/gpumon/auth/token"


def test_basic_credentials_come_from_the_secret_as_environment(helm: Path) -> None:
    docs = render(helm, {**BASIC, **MONITORED})
    for kind, component in (("DaemonSet", "exporter"), ("Deployment", "controller")):
        env = {e["name"]: e.get("valueFrom") for e in container(docs, kind, component)["env"]}
        assert env["GPUMON_AUTH__BASIC_USERNAME"] == {
            "secretKeyRef": {"name": "gpumon-scrape", "key": "username"}
        }
        assert env["GPUMON_AUTH__BASIC_PASSWORD"] == {
            "secretKeyRef": {"name": "gpumon-scrape", "key": "password"}
        }
        assert "auth" not in config_of(docs, component)  # no credential in a ConfigMap
        endpoint = one(docs, "ServiceMonitor", f"r-gpumon-{component}")["spec"]["endpoints"][0]
        assert endpoint["basicAuth"] == {
            "username": {"name": "gpumon-scrape", "key": "username"},
            "password": {"name": "gpumon-scrape", "key": "password"},
        }


def refusal(helm: Path, *sets: str) -> str:
    """helm template's error for these ``--set`` values (it must fail)."""
    argv = [str(helm), "template", "r", str(CHART)] + [a for kv in sets for a in ("--set", kv)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, "rendered, but should have been refused"
    return result.stderr


def test_basic_auth_refuses_direct_signals(helm: Path) -> None:
    stderr = refusal(helm, "auth.mode=basic", "auth.secretName=s", "controller.config.signals.source=direct")
    assert "direct signals send bearer tokens" in stderr


def test_kubernetes_mode_wires_reviews_rbac_and_prometheus(helm: Path) -> None:
    values = {**KUBERNETES, **MONITORED, "auth.kubernetes.metricsReaderRole.subjects": [PROMETHEUS_SA]}
    docs = render(helm, values)
    for component in ("exporter", "controller"):
        assert config_of(docs, component)["auth"] == {
            "mode": "kubernetes",
            "kubernetes": {"cache_ttl_seconds": 10},
        }
        binding = one(docs, "ClusterRoleBinding", f"r-gpumon-{component}-auth-delegator")
        assert binding["roleRef"]["name"] == "system:auth-delegator"
        endpoint = one(docs, "ServiceMonitor", f"r-gpumon-{component}")["spec"]["endpoints"][0]
        assert endpoint["bearerTokenFile"] == SA_TOKEN
    # The exporter needs its token for the reviews, even without pod attribution.
    docs_plain = render(helm, {**values, "exporter.podAttribution.enabled": False})
    exporter_pod = one(docs_plain, "DaemonSet", "r-gpumon-exporter")["spec"]["template"]["spec"]
    assert exporter_pod["automountServiceAccountToken"] is True
    # ... and doctor, in its pod, reads the snapshot with it; nothing of pods without attribution.
    snapshot = {"nonResourceURLs": ["/gpumon/api/v1/snapshot"], "verbs": ["get"]}
    assert one(docs_plain, "ClusterRole", "r-gpumon-exporter")["rules"] == [snapshot]
    assert snapshot in one(docs, "ClusterRole", "r-gpumon-exporter")["rules"]
    reader = one(docs, "ClusterRole", "r-gpumon-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert one(docs, "ClusterRoleBinding", "r-gpumon-metrics-reader")["subjects"] == [PROMETHEUS_SA]
    assert config_of(docs, "controller")["signals"]["direct"]["bearer_token_file"] == SA_TOKEN
    rules = one(docs, "ClusterRole", "r-gpumon-controller")["rules"]
    assert {"nonResourceURLs": ["/gpumon/api/v1/watch", "/gpumon/api/v1/snapshot"], "verbs": ["get"]} in rules


def test_exporter_reads_resource_slices_unless_dra_attribution_is_off(helm: Path) -> None:
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    slices = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "list", "watch"],
    }
    assert one(render(helm, {}), "ClusterRole", "r-gpumon-exporter")["rules"] == [pods, slices]
    dra_off = {"exporter.config": {"pods": {"dra_drivers": []}}}
    assert one(render(helm, dra_off), "ClusterRole", "r-gpumon-exporter")["rules"] == [pods]
    other = {"exporter.config": {"pods": {"dra_drivers": ["gpu.example.com"]}}}
    assert one(render(helm, other), "ClusterRole", "r-gpumon-exporter")["rules"] == [pods, slices]


def test_windows_exporter_refuses_tls_and_auth_it_cannot_serve(helm: Path) -> None:
    for extra in (("tls.enabled=true", "tls.secretName=s"), ("auth.mode=kubernetes",)):
        stderr = refusal(helm, "exporter.windows.enabled=true", *extra)
        assert "not wired for the Windows HostProcess exporter" in stderr


# -- network and pod security ---------------------------------------------------------------------


def test_network_policies_let_in_scrapers_and_the_controller_only(helm: Path) -> None:
    docs = render(helm, {})
    prometheus = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    controller_pods = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "gpumon",
                "app.kubernetes.io/instance": "r",
                "app.kubernetes.io/component": "controller",
            }
        }
    }
    exporter = one(docs, "NetworkPolicy", "r-gpumon-exporter")["spec"]
    assert exporter["policyTypes"] == ["Ingress"]
    assert exporter["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [prometheus, controller_pods]}
    ]
    controller = one(docs, "NetworkPolicy", "r-gpumon-controller")["spec"]
    assert controller["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [prometheus]}
    ]
    # No scrapers and no controller: nothing gets in.
    closed = render(helm, {"networkPolicy.scrapers": [], "controller.enabled": False})
    assert one(closed, "NetworkPolicy", "r-gpumon-exporter")["spec"]["ingress"] == []


@pytest.mark.parametrize("attribution", [True, False])
def test_security_contexts_are_as_tight_as_each_program_allows(helm: Path, attribution: bool) -> None:
    docs = render(helm, {"exporter.podAttribution.enabled": attribution})
    for kind, component in (("DaemonSet", "exporter"), ("Deployment", "controller")):
        pod = one(docs, kind, f"r-gpumon-{component}")["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostIPC")
        root = component == "exporter" and attribution
        assert pod["securityContext"]["runAsNonRoot"] is not root
        assert pod["securityContext"]["runAsUser"] == (0 if root else 65534)
        assert bool(pod.get("hostPID")) is root
        host_paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
        assert host_paths == (["/proc", "/var/lib/kubelet/pod-resources"] if root else [])


def _controller_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (role,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-controller")
    ]
    return role["rules"]


@pytest.mark.parametrize("value", [False, "false"])
def test_device_taint_rights_follow_the_controllers_setting(helm: Path, value: Any) -> None:
    """DeviceTaintRule rights are granted while quarantine.device_taints is on (the default)
    and left out when it is off; the DRA reads stay either way."""

    def resources(values: Values) -> set[str]:
        return {r for rule in _controller_rules(render(helm, values)) for r in rule.get("resources") or ()}

    on = resources({})
    assert {"devicetaintrules", "resourceclaims", "resourceslices"} <= on
    off = resources({"controller.config": {"quarantine": {"device_taints": value}}})
    assert on - off == {"devicetaintrules"}


def test_a_repairing_pool_gets_the_charts_node_local_jobs_and_only_then_their_rbac(helm: Path) -> None:
    docs = render(helm, REPAIRING)
    pool = ControllerConfig.model_validate(config_of(docs, "controller")).pools[0]
    assert (
        pool.repair is not None and pool.repair.reset_job is not None and pool.repair.reboot_job is not None
    )
    reset = pool.repair.reset_job.template["spec"]
    assert reset["hostPID"] and reset["containers"][0]["securityContext"] == {"privileged": True}
    assert "nvidia-smi --gpu-reset" in reset["containers"][0]["args"][0]
    role = one(docs, "Role", "r-gpumon-controller")
    assert {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get"]} in role["rules"]
    # The replacement step: get and delete the Machine or NodeClaim, nothing else of them.
    cluster_role = one(docs, "ClusterRole", "r-gpumon-controller")
    replacing = [r for r in cluster_role["rules"] if "delete" in r.get("verbs", ())]
    assert {
        "apiGroups": ["cluster.x-k8s.io"],
        "resources": ["machines"],
        "verbs": ["get", "delete"],
    } in replacing
    assert {
        "apiGroups": ["karpenter.sh"],
        "resources": ["nodeclaims"],
        "verbs": ["get", "delete"],
    } in replacing
    # Without a repairing pool: no Job rights at all; a pool's own Job is kept as it is.
    plain = one(render(helm, {}), "Role", "r-gpumon-controller")
    assert not any("jobs" in r.get("resources", ()) for r in plain["rules"])
    plain_cluster = one(render(helm, {}), "ClusterRole", "r-gpumon-controller")
    assert not any({"machines", "nodeclaims"} & set(r.get("resources", ())) for r in plain_cluster["rules"])
    own = {"template": {"spec": {"containers": [{"name": "bmc", "image": "bmc:1"}]}}}
    pools = [
        {**REPAIRING["controller.config"]["pools"][0], "repair": {"steps": ["reboot"], "reboot_job": own}}
    ]
    mine = config_of(render(helm, {"controller.config": {"pools": pools}}), "controller")["pools"][0][
        "repair"
    ]
    assert mine["reboot_job"] == own
    # The exporter is never privileged by this.
    exporter = container(docs, "DaemonSet", "exporter")
    assert not (exporter.get("securityContext") or {}).get("privileged")

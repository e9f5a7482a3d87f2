"""Command lines, kwok's configuration and the binaries' locations, built without running
anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpumon.devcluster import binaries, components
from gpumon.devcluster.components import Layout, Options, Ports
from gpumon.devcluster.pki import PkiFiles

PORTS = Ports(
    etcd_client=2379, etcd_peer=2380, apiserver=6443, controller_manager=10257, scheduler=10259, kwok=10247
)


def _fake_cache(root: Path) -> Path:
    kube = root / f"kubernetes-{binaries.KUBERNETES_VERSION}" / "bin"
    for path in (
        root / f"etcd-{binaries.ETCD_VERSION}" / "bin" / "etcd",
        kube / "kube-apiserver",
        kube / "kube-controller-manager",
        kube / "kube-scheduler",
        kube / "kubectl",
        root / f"kwok-{binaries.KWOK_VERSION}" / "bin" / "kwok",
        *(root / f"kwok-{binaries.KWOK_VERSION}" / "stages" / f"{s}.yaml" for s in binaries.KWOK_STAGES),
        root / binaries.CRDS_DIR_NAME / "b.yaml",
        root / binaries.CRDS_DIR_NAME / "a.yaml",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


@pytest.fixture
def tools(tmp_path: Path) -> binaries.Tools:
    return binaries.locate(_fake_cache(tmp_path / "cache"))


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    names = PkiFiles.__dataclass_fields__
    return Layout(tmp_path / "c", PkiFiles(**{n: tmp_path / "c" / "pki" / n for n in names}))


def _flags(argv: tuple[str, ...]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:])


def test_cache_dir_follows_the_build_script() -> None:
    assert binaries.cache_dir({"GPUMON_TOOLS_CACHE": "/x"}) == Path("/x")
    assert binaries.cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/gpumon/tools")
    assert binaries.cache_dir({}) == Path.home() / ".cache" / "gpumon" / "tools"


def test_locate_finds_everything_and_sorts_crds(tools: binaries.Tools) -> None:
    assert tools.kube_apiserver.name == "kube-apiserver"
    assert [p.name for p in tools.crds] == ["a.yaml", "b.yaml"]
    assert [p.stem for p in tools.kwok_stages] == list(binaries.KWOK_STAGES)


def test_locate_names_what_is_missing_and_how_to_build_it(tmp_path: Path) -> None:
    cache = _fake_cache(tmp_path)
    (cache / f"kubernetes-{binaries.KUBERNETES_VERSION}" / "bin" / "kubectl").unlink()
    with pytest.raises(binaries.ToolsMissing) as missing:
        binaries.locate(cache)
    message = str(missing.value)
    assert "make setup" in message and "hack/build-tools.sh" in message
    assert "kubectl" in message and "kube-apiserver" not in message


def test_apiserver_flags(tools: binaries.Tools, layout: Layout) -> None:
    c = components.kube_apiserver(tools, PORTS, layout, Options())
    flags = _flags(c.argv)
    assert flags["etcd-servers"] == "http://127.0.0.1:2379"
    assert flags["secure-port"] == "6443" and flags["bind-address"] == "127.0.0.1"
    assert flags["authorization-mode"] == "RBAC"
    assert flags["client-ca-file"] == str(layout.pki.ca_cert)
    assert flags["service-account-signing-key-file"] == str(layout.pki.service_account_key)
    assert flags["requestheader-client-ca-file"] == str(layout.pki.front_proxy_ca_cert)
    assert flags["requestheader-allowed-names"] == "front-proxy-client"
    assert flags["proxy-client-cert-file"] == str(layout.pki.front_proxy_client_cert)
    assert c.health.url == "https://127.0.0.1:6443/readyz" and c.health.client_cert


def test_components_start_in_waves_on_their_own_ports(tools: binaries.Tools, layout: Layout) -> None:
    all_ = components.all_components(tools, PORTS, layout, Options())
    assert [(c.name, c.wave) for c in all_] == [
        ("etcd", 0),
        ("kube-apiserver", 1),
        ("kube-controller-manager", 2),
        ("kube-scheduler", 2),
        ("kwok", 2),
    ]
    ports = [c.health.url.rsplit(":", 1)[1].split("/")[0] for c in all_]
    assert len(set(ports)) == len(ports)
    assert "--unsafe-no-fsync" in all_[0].argv


def test_benchmark_flags_reach_etcd_and_the_api_server(tools: binaries.Tools, layout: Layout) -> None:
    options = Options(
        etcd_flags=("--quota-backend-bytes=8589934592",), apiserver_flags=("--max-requests-inflight=800",)
    )
    etcd, apiserver, *_ = components.all_components(tools, PORTS, layout, options)
    assert etcd.argv[-1] == "--quota-backend-bytes=8589934592"
    assert _flags(apiserver.argv)["max-requests-inflight"] == "800"


def test_controller_manager_flags(tools: binaries.Tools, layout: Layout) -> None:
    flags = _flags(
        components.kube_controller_manager(
            tools, PORTS, layout, Options(node_monitor_grace_period_seconds=17)
        ).argv
    )
    assert flags["use-service-account-credentials"] == "true"
    assert flags["service-account-private-key-file"] == str(layout.pki.service_account_key)
    assert flags["cluster-signing-key-file"] == str(layout.pki.ca_key)
    assert flags["node-monitor-grace-period"] == "17s"
    assert flags["kubeconfig"] == str(layout.kubeconfig("kube-controller-manager"))


def test_kwok_flags(tools: binaries.Tools, layout: Layout) -> None:
    flags = _flags(components.kwok(tools, PORTS, layout, Options()).argv)
    assert flags["manage-nodes-with-annotation-selector"] == "kwok.x-k8s.io/node=fake"
    assert flags["node-lease-duration-seconds"] == "40"
    assert flags["config"] == str(layout.kwok_config)


STAGE = "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {}\nspec: {{}}\n"


def test_kwok_config_is_a_configuration_then_the_stages() -> None:
    text = components.kwok_config([STAGE.format("a"), "---\n" + STAGE.format("b")])
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["KwokConfiguration", "Stage", "Stage"]
    assert [d["metadata"]["name"] for d in docs[1:]] == ["a", "b"]
    options = docs[0]["options"]
    # kwok does not default a given configuration: a zero parallelism would stop it.
    assert all(
        options[k] > 0
        for k in (
            "nodeLeaseParallelism",
            "podPlayStageParallelism",
            "nodePlayStageParallelism",
            "podsOnNodeSyncParallelism",
        )
    )
    assert options["cidr"] == components.POD_CIDR


def test_kwok_config_sets_the_pod_workers_it_is_given() -> None:
    assert yaml.safe_load(components.kwok_config([], 16))["options"]["podPlayStageParallelism"] == 16
    assert yaml.safe_load(components.kwok_config([]))["options"]["podPlayStageParallelism"] == 4


def test_kwok_config_refuses_what_is_not_a_stage() -> None:
    with pytest.raises(ValueError, match="not a kwok Stage"):
        components.kwok_config(["kind: Pod\n"])


def test_device_taint_rules_are_enabled_on_every_component_that_reads_them(
    tools: binaries.Tools, layout: Layout
) -> None:
    # Beta and off by default in v1.36.3: the API server serves the rules and grants their RBAC,
    # the scheduler hides tainted devices, KCM's device-taint-eviction controller watches them.
    by_name = {
        c.name: _flags(c.argv)
        for c in components.all_components(tools, PORTS, layout, Options())
        if c.name != "etcd"  # etcd has a bare flag; it knows no Kubernetes gates anyway
    }
    for name in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        assert by_name[name]["feature-gates"] == "DRADeviceTaintRules=true", name
    assert by_name["kube-apiserver"]["runtime-config"] == "resource.k8s.io/v1beta2/devicetaintrules=true"
    assert "feature-gates" not in by_name["kwok"]

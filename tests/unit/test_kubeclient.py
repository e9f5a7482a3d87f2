"""Where gpumon's small API client finds its credentials: the pod's service account, else the
kubeconfig's current context (tests/cluster uses both against the real API server)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.kubeclient import CredentialsError, from_kubeconfig, in_cluster, kubeconfig_path, load_credentials


def kubeconfig(tmp_path: Path, user: dict[str, Any], server: str = "http://127.0.0.1:6443") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "other", "cluster": {"server": "http://other:1"}},
                    {"name": "c", "cluster": {"server": server + "/"}},
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_the_current_contexts_server_and_token(tmp_path: Path) -> None:
    creds = from_kubeconfig(kubeconfig(tmp_path, {"token": "abc"}))
    assert creds.server == "http://127.0.0.1:6443"
    assert creds.ssl is None
    assert creds.headers() == {"Authorization": "Bearer abc"}


def test_a_token_file_relative_to_the_kubeconfig_is_read_for_every_request(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("one\n")
    creds = from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "tok"}))
    assert creds.headers() == {"Authorization": "Bearer one"}
    (tmp_path / "tok").write_text("two\n")  # rotated in place, as the kubelet does
    assert creds.headers() == {"Authorization": "Bearer two"}


def test_https_with_skip_verify(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {}, server="https://127.0.0.1:6443")
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][1]["cluster"]["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump(doc))
    creds = from_kubeconfig(path)
    assert creds.ssl is not None and not creds.ssl.check_hostname
    assert creds.headers() == {}


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"exec": {"command": "aws"}}, "exec plugins and auth providers are not supported"),
        (
            {"client-certificate-data": base64.b64encode(b"not a pem").decode(), "client-key-data": ""},
            "certificates",
        ),
    ],
)
def test_unusable_users_say_why(tmp_path: Path, user: dict[str, Any], message: str) -> None:
    with pytest.raises(CredentialsError, match=message):
        from_kubeconfig(kubeconfig(tmp_path, user, server="https://127.0.0.1:6443"))


def test_a_kubeconfig_without_the_current_context(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"clusters": [], "contexts": [], "current-context": "gone"}))
    with pytest.raises(CredentialsError, match="not usable"):
        from_kubeconfig(path)


def test_in_cluster_needs_the_service_host_and_the_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster(env, tmp_path) is None  # no token mounted
    (tmp_path / "token").write_text("sa-token")
    assert in_cluster({}, tmp_path) is None  # not in a pod
    with pytest.raises(CredentialsError, match="CA cannot be loaded"):  # mounted beside the token
        in_cluster(env, tmp_path)


def test_kubeconfig_path_is_the_first_file_of_kubeconfig(tmp_path: Path) -> None:
    assert kubeconfig_path({"KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}) == tmp_path / "a"
    assert kubeconfig_path({}) == Path.home() / ".kube" / "config"


def test_no_credentials_at_all(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="no kubeconfig at"):
        load_credentials({"KUBECONFIG": str(tmp_path / "missing")})

"""Where gpumon's API client finds its credentials: the pod's service account, else the
kubeconfig's current context, its exec plugin run for a token (tests/cluster uses the first two
against the real API server)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.kube.credentials import CredentialsError, in_cluster, load_credentials
from gpumon.kube.kubeconfig import from_kubeconfig, kubeconfig_paths


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
        ({"auth-provider": {"name": "gcp"}}, "auth providers and basic auth are not supported"),
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
    with pytest.raises(CredentialsError, match="not usable: context 'gone' is not defined"):
        from_kubeconfig(path)


def test_in_cluster_needs_the_service_host_and_the_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster(env, tmp_path) is None  # no token mounted
    (tmp_path / "token").write_text("sa-token")
    assert in_cluster({}, tmp_path) is None  # not in a pod
    with pytest.raises(CredentialsError, match="CA cannot be loaded"):  # mounted beside the token
        in_cluster(env, tmp_path)


def test_kubeconfig_paths_are_the_files_of_kubeconfig(tmp_path: Path) -> None:
    assert kubeconfig_paths({"KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}) == [tmp_path / "a", tmp_path / "b"]
    assert kubeconfig_paths({}) == [Path.home() / ".kube" / "config"]


def test_kubeconfigs_merge_first_definition_wins_and_missing_files_are_skipped(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.write_text(
        yaml.safe_dump(
            {
                "current-context": "ctx",
                "clusters": [{"name": "c", "cluster": {"server": "http://first:1"}}],
                "users": [],
            }
        )
    )
    second = kubeconfig(tmp_path, {"token": "abc"})  # defines c again, u and ctx
    creds = from_kubeconfig([tmp_path / "absent", first, second])
    assert creds.server == "http://first:1"
    assert creds.headers() == {"Authorization": "Bearer abc"}


def test_no_credentials_at_all(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match=r"not in a cluster, and cannot read kubeconfig .*: No such"):
        load_credentials({"KUBECONFIG": str(tmp_path / "missing")})


PLUGIN = """import json, os, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
count = {path!r}
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(n))
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
    "status": {{"token": os.environ["PREFIX"] + str(n) + sys.argv[1], "expirationTimestamp": {expiry!r}}}}}))
"""


@pytest.mark.parametrize(
    ("expiry", "second"), [("2999-01-01T00:00:00Z", "tok1!"), ("2000-01-01T00:00:00Z", "tok2!")]
)
async def test_an_exec_plugin_gives_the_token_until_its_expiry(
    tmp_path: Path, expiry: str, second: str
) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN.format(path=str(tmp_path / "count"), expiry=expiry))
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["plugin.py", "!"],  # relative to the kubeconfig, as kubectl runs it
            "env": [{"name": "PREFIX", "value": "tok"}],
        }
    }
    creds = from_kubeconfig(kubeconfig(tmp_path, user))
    assert await creds.authorization() == {"Authorization": "Bearer tok1!"}
    # Cached until (a minute before) its expiry; an expired one is asked for again.
    assert await creds.authorization() == {"Authorization": f"Bearer {second}"}


async def test_a_failing_exec_plugin_says_why(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "false"}}
    creds = from_kubeconfig(kubeconfig(tmp_path, user))
    with pytest.raises(CredentialsError, match="exec plugin 'false' failed"):
        await creds.authorization()

"""The throw-away PKI and kubeconfigs: chains, names, usages and embedded data are what the
control plane's components check."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpumon.devcluster import kubeconfig, pki

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def keys() -> pki.Pki:
    return pki.generate(NOW)


def _cert(pair: pki.KeyPair) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pair.cert_pem)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def test_every_leaf_is_signed_by_its_authority(keys: pki.Pki) -> None:
    ca, front = _cert(keys.ca), _cert(keys.front_proxy_ca)
    for pair in (keys.serving, keys.admin, keys.controller_manager, keys.scheduler, keys.kwok):
        assert _signed_by(_cert(pair), ca)
        assert not _signed_by(_cert(pair), front)
    assert _signed_by(_cert(keys.front_proxy_client), front)
    assert not _signed_by(_cert(keys.front_proxy_client), ca)


def test_serving_certificate_names_loopback_and_the_kubernetes_service(keys: pki.Pki) -> None:
    sans = _cert(keys.serving).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    usage = _cert(keys.serving).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]


@pytest.mark.parametrize(
    ("attr", "user", "groups"),
    [
        ("admin", "gpumon-admin", ["system:masters"]),
        ("controller_manager", "system:kube-controller-manager", []),
        ("scheduler", "system:kube-scheduler", []),
        ("front_proxy_client", "front-proxy-client", []),
    ],
)
def test_client_certificates_carry_the_identity_kubernetes_reads(
    keys: pki.Pki, attr: str, user: str, groups: list[str]
) -> None:
    cert = _cert(getattr(keys, attr))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [user]
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == groups
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_validity_brackets_now_with_room_for_clock_skew(keys: pki.Pki) -> None:
    cert = _cert(keys.admin)
    assert cert.not_valid_before_utc < NOW < cert.not_valid_after_utc
    assert cert.not_valid_after_utc - NOW >= datetime.timedelta(days=300)


def test_keys_match_their_certificates(keys: pki.Pki) -> None:
    for pair in (keys.ca, keys.serving, keys.admin):
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
        assert key.public_key().public_numbers() == _cert(pair).public_key().public_numbers()  # type: ignore[union-attr]
    sa = serialization.load_pem_private_key(keys.service_account_key_pem, password=None)
    assert isinstance(sa, ec.EllipticCurvePrivateKey)
    pub = serialization.load_pem_public_key(keys.service_account_pub_pem)
    assert pub.public_numbers() == sa.public_key().public_numbers()  # type: ignore[union-attr]


def test_written_files_are_private_and_load_into_tls(keys: pki.Pki, tmp_path: Path) -> None:
    files = pki.write(keys, tmp_path / "pki")
    assert all((p.stat().st_mode & 0o077) == 0 for p in (tmp_path / "pki").iterdir())
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    ctx.load_cert_chain(str(files.admin_cert), str(files.admin_key))
    ctx.load_cert_chain(str(files.serving_cert), str(files.serving_key))


def test_kubeconfig_embeds_server_ca_and_client(keys: pki.Pki, tmp_path: Path) -> None:
    doc = kubeconfig.build("https://127.0.0.1:6443", keys.ca.cert_pem, keys.admin, "gpumon-admin")
    path = kubeconfig.write(doc, tmp_path / "admin.kubeconfig")
    loaded = yaml.safe_load(path.read_text())
    cluster = loaded["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == keys.ca.cert_pem
    user = loaded["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == keys.admin.cert_pem
    assert base64.b64decode(user["client-key-data"]) == keys.admin.key_pem
    context = next(c for c in loaded["contexts"] if c["name"] == loaded["current-context"])
    assert context["context"] == {"cluster": loaded["clusters"][0]["name"], "user": "gpumon-admin"}
    assert (path.stat().st_mode & 0o077) == 0


def test_a_later_component_gets_a_loopback_serving_certificate_and_a_client_one_from_the_ca(
    keys: pki.Pki,
) -> None:
    """Cluster API's manager, started after the cluster: its webhooks' serving certificate and
    its client identity, both signed by the written CA."""
    ca = _cert(keys.ca)
    serving = _cert(pki.loopback_serving(keys.ca, "cluster-api-webhooks", NOW))
    assert _signed_by(serving, ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    who = pki.ClientIdentity("cluster-api-manager", ("system:masters",))
    client = _cert(pki.client(keys.ca, who, NOW))
    assert _signed_by(client, ca)
    assert client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"

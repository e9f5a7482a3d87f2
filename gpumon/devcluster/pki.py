"""A throw-away PKI for one local control plane, laid out as kubeadm does: one cluster CA that
signs the serving certificate and every client certificate, a separate front-proxy CA for the
aggregation layer, and a service-account signing key. ECDSA P-256 throughout: a key costs
microseconds where RSA-2048 costs tens of milliseconds, and every component accepts it."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.0.0.1")  # loopback, and the `kubernetes` Service's cluster IP
FRONT_PROXY_CLIENT_NAME = "front-proxy-client"
_VALIDITY = datetime.timedelta(days=365)
_CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class ClientIdentity:
    user: str
    groups: tuple[str, ...] = ()


ADMIN = ClientIdentity("gpumon-admin", ("system:masters",))
CONTROLLER_MANAGER = ClientIdentity("system:kube-controller-manager")
SCHEDULER = ClientIdentity("system:kube-scheduler")
KWOK = ClientIdentity("kwok-controller", ("system:masters",))


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    serving: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    kwok: KeyPair
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    service_account_key_pem: bytes
    service_account_pub_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALIDITY)
    )


@dataclass(frozen=True)
class _Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pair(self) -> KeyPair:
        return KeyPair(self.cert.public_bytes(serialization.Encoding.PEM), _key_pem(self.key))


def _authority(common_name: str, now: datetime.datetime) -> _Authority:
    key = _key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Authority(key, cert)


def _leaf(
    ca: _Authority,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    now: datetime.datetime,
    sans: Sequence[x509.GeneralName] = (),
) -> KeyPair:
    key = _key()
    builder = (
        _builder(subject, ca.cert.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _client(ca: _Authority, who: ClientIdentity, now: datetime.datetime) -> KeyPair:
    return _leaf(ca, _name(who.user, who.groups), ExtendedKeyUsageOID.CLIENT_AUTH, now)


def generate(now: datetime.datetime) -> Pki:
    ca = _authority("gpumon-devcluster-ca", now)
    front_proxy_ca = _authority("gpumon-devcluster-front-proxy-ca", now)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in SERVING_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
    sa_key = _key()
    return Pki(
        ca=ca.pair,
        serving=_leaf(ca, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, now, sans),
        admin=_client(ca, ADMIN, now),
        controller_manager=_client(ca, CONTROLLER_MANAGER, now),
        scheduler=_client(ca, SCHEDULER, now),
        kwok=_client(ca, KWOK, now),
        front_proxy_ca=front_proxy_ca.pair,
        front_proxy_client=_client(front_proxy_ca, ClientIdentity(FRONT_PROXY_CLIENT_NAME), now),
        service_account_key_pem=_key_pem(sa_key),
        service_account_pub_pem=sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


@dataclass(frozen=True)
class PkiFiles:
    """Where :func:`write` put each file; the components' flags point here."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path
    service_account_key: Path
    service_account_pub: Path


def write(pki: Pki, directory: Path) -> PkiFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = PkiFiles(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
    )
    contents = {
        files.ca_cert: pki.ca.cert_pem,
        files.ca_key: pki.ca.key_pem,
        files.serving_cert: pki.serving.cert_pem,
        files.serving_key: pki.serving.key_pem,
        files.admin_cert: pki.admin.cert_pem,
        files.admin_key: pki.admin.key_pem,
        files.front_proxy_ca_cert: pki.front_proxy_ca.cert_pem,
        files.front_proxy_client_cert: pki.front_proxy_client.cert_pem,
        files.front_proxy_client_key: pki.front_proxy_client.key_pem,
        files.service_account_key: pki.service_account_key_pem,
        files.service_account_pub: pki.service_account_pub_pem,
    }
    for path, data in contents.items():
        path.write_bytes(data)
        path.chmod(0o600)
    return files


# -- certificates for components started later (Cluster API's manager), from the written CA ----


def _loaded(ca: KeyPair) -> _Authority:
    key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("the cluster CA's key is not an ECDSA key")
    return _Authority(key, x509.load_pem_x509_certificate(ca.cert_pem))


def loopback_serving(ca: KeyPair, common_name: str, now: datetime.datetime) -> KeyPair:
    """A serving certificate for a loopback endpoint (127.0.0.1, localhost) signed by ``ca``:
    what the API server verifies when it calls a webhook there with ``ca`` as caBundle."""
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return _leaf(_loaded(ca), _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, now, sans)


def client(ca: KeyPair, who: ClientIdentity, now: datetime.datetime) -> KeyPair:
    return _client(_loaded(ca), who, now)


def read_ca(files: PkiFiles) -> KeyPair:
    return KeyPair(files.ca_cert.read_bytes(), files.ca_key.read_bytes())

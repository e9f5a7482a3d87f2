"""TLS for the servers (their certificate and key) and for the controller as a client of the
exporters (the CA it trusts). Each file is read through the config reader first, so a missing,
unreadable or wrong file is a :class:`~gpumon.config.files.ConfigError` naming its field: OpenSSL's
own errors (errno, "PEM lib") do not say which file it was reading."""

from __future__ import annotations

import ssl
from pathlib import Path

from gpumon.config import TlsConfig
from gpumon.config.files import field_error, read_config_bytes


def _pem_certificates(path: Path, field: str, what: str) -> None:
    data = read_config_bytes(path, what, field=field)
    try:
        if b"-----BEGIN CERTIFICATE-----" not in data:
            raise ValueError("no PEM certificate in it")
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=data.decode("ascii"))
    except (ValueError, ssl.SSLError) as e:  # UnicodeDecodeError is a ValueError
        raise field_error(field, f"cannot load {path}: {e}") from None


def server_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The server's context, or None to serve plain HTTP (no certificate configured)."""
    if tls.cert_file is None or tls.key_file is None:
        return None
    _pem_certificates(tls.cert_file, "tls.cert_file", "certificate")
    read_config_bytes(tls.key_file, "private key", field="tls.key_file")

    def no_passphrase() -> bytes:
        # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
        raise field_error("tls.key_file", f"{tls.key_file} is encrypted; give an unencrypted key")

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        # The certificate parsed above, so what fails here is the key.
        context.load_cert_chain(tls.cert_file, tls.key_file, password=no_passphrase)
    except (OSError, ssl.SSLError) as e:
        if isinstance(e, ssl.SSLError) and e.reason == "KEY_VALUES_MISMATCH":
            detail = f"{tls.key_file} is not the key of {tls.cert_file}"
        else:
            detail = f"cannot load {tls.key_file}: {e}"
        raise field_error("tls.key_file", detail) from None
    return context


def client_context(ca_file: Path, field: str) -> ssl.SSLContext:
    """A client context that trusts ``ca_file`` (PEM, one or more CA certificates) only."""
    _pem_certificates(ca_file, field, "CA certificate")
    return ssl.create_default_context(cafile=str(ca_file))

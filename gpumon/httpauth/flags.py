"""The command-line flags of the server settings both programs share (the rest is config)."""

from __future__ import annotations

from gpumon.config import ConfigFlag

SERVER_FLAGS: tuple[ConfigFlag, ...] = (
    ("--tls-cert-file", "tls.cert_file", "FILE", "serve HTTPS with this certificate (with --tls-key-file)"),
    ("--tls-key-file", "tls.key_file", "FILE", "private key of --tls-cert-file"),
    (
        "--auth-mode",
        "auth.mode",
        "MODE",
        "static (the auth.* credentials given, if any) | kubernetes (TokenReview + SubjectAccessReview)",
    ),
)

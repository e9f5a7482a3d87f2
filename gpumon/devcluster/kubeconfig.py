"""Kubeconfig documents with every certificate embedded, so a file is self-contained and can be
copied out of the cluster's directory."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from gpumon.devcluster.pki import KeyPair

CONTEXT_NAME = "gpumon-devcluster"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def build(server: str, ca_pem: bytes, client: KeyPair, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CONTEXT_NAME, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert_pem),
                    "client-key-data": _b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": user}}],
        "current-context": CONTEXT_NAME,
        "preferences": {},
    }


def write(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path

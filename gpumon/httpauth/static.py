"""Static credentials (``auth.mode: static``): HTTP basic and/or a bearer token read from a file."""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path

from gpumon.config import AuthConfig
from gpumon.config.files import ConfigError, read_config_bytes


@dataclass(slots=True)
class Authenticator:
    """Basic credentials and/or a bearer token read from a file (re-read so rotation works)."""

    basic: tuple[bytes, bytes] | None = None
    token_file: Path | None = None
    token: bytes | None = None

    @property
    def enabled(self) -> bool:
        return self.basic is not None or self.token_file is not None

    def reload_token(self) -> None:
        if self.token_file is None:
            return
        try:
            token = read_config_bytes(self.token_file, "bearer token file").strip()
        except ConfigError as e:
            raise ConfigError(f"auth.bearer_token_file: {e}") from None
        if not token:
            raise ConfigError(f"auth.bearer_token_file: {self.token_file} is empty")
        self.token = token

    def allows(self, authorization: str) -> bool:
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self.token is not None:
            return hmac.compare_digest(value.encode(), self.token)
        if scheme == "basic" and self.basic is not None:
            try:
                user, _, password = base64.b64decode(value, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            # Both comparisons always run, so timing does not tell which part was wrong.
            ok_user = hmac.compare_digest(user, self.basic[0])
            ok_password = hmac.compare_digest(password, self.basic[1])
            return ok_user & ok_password
        return False

    def challenge(self) -> str:
        return 'Basic realm="gpumon"' if self.basic is not None else 'Bearer realm="gpumon"'


def authenticator(cfg: AuthConfig) -> Authenticator:
    """Build from config, reading the token file now: a bad file is a configuration error."""
    basic = None
    if cfg.basic_username is not None and cfg.basic_password is not None:
        basic = (cfg.basic_username.encode(), cfg.basic_password.get_secret_value().encode())
    auth = Authenticator(basic=basic, token_file=cfg.bearer_token_file)
    auth.reload_token()
    return auth

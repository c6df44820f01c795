"""The service's settings: where it listens and the token that guards every write."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from outcome_flywheel.settings import env

MAX_BODY_BYTES = 64 * 1024  # a decision or a feedback line is a few KB; anything bigger is refused unread


@dataclass
class ServiceConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "FLYWHEEL_API_HOST: the address to bind; loopback unless told otherwise."})
    port: int = field(default=8765, metadata={"help": "FLYWHEEL_API_PORT."})
    token: str = field(default="", metadata={"help": "FLYWHEEL_API_TOKEN: the bearer token writes need; empty = one made at start and printed."})
    token_generated: bool = field(default=False, metadata={"help": "True when the token was made at start (printed once)."})
    max_body_bytes: int = field(default=MAX_BODY_BYTES, metadata={"help": "Larger request bodies get a 413, unread."})

    def __post_init__(self):
        if not self.token:
            # Like notebook servers: a fresh random token per start, printed with the page's URL.
            self.token = secrets.token_urlsafe(24)
            self.token_generated = True

    @classmethod
    def from_env(cls) -> "ServiceConfig":
        return cls(host=env("FLYWHEEL_API_HOST"), port=int(env("FLYWHEEL_API_PORT")), token=env("FLYWHEEL_API_TOKEN", ""))

    def derived(self, purpose: str) -> str:
        """A value derived from the token (the page's session cookie, its CSRF field): a browser never holds the token itself."""
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    def is_token(self, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(candidate.encode(), self.token.encode())

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost")

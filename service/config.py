"""The service's settings: where it listens, the token that guards every write, and the Dagster
webserver runs are submitted to (FLYWHEEL_DAGSTER_URL; unset = the embedded worker)."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from outcome_flywheel.settings import env

MAX_BODY_BYTES = 64 * 1024  # a decision or a feedback line is a few KB; anything bigger is refused unread
SESSION_TTL_S = 12 * 3600  # a page's sign-in lasts a working day
LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"]
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DAGSTER_URL_VARIABLE = "FLYWHEEL_DAGSTER_URL"
SERVE_MAX_TOKENS_VARIABLE = "FLYWHEEL_SERVE_MAX_TOKENS"
SERVE_MAX_TOKENS = 512  # per completion of /v1/chat/completions: generation is the expensive thing the service does


def check_dagster_url(url: str) -> str:
    """`url` without a trailing slash, or ValueError naming what is wrong with it: an http(s) URL of a
    Dagster webserver (`http://127.0.0.1:3000`, or with a path prefix `https://host/dagster`)."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    try:
        parts.port  # a bad port raises here
    except ValueError as err:
        raise ValueError(f"{DAGSTER_URL_VARIABLE}={url!r}: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username:
        raise ValueError(
            f"{DAGSTER_URL_VARIABLE}={url!r}: expected the Dagster webserver's http(s) URL, "
            "such as http://127.0.0.1:3000 (no query, fragment or credentials)"
        )
    return url


def serve_max_tokens_from_env() -> int:
    """FLYWHEEL_SERVE_MAX_TOKENS as a whole number (ValueError naming the variable otherwise)."""
    value = os.environ.get(SERVE_MAX_TOKENS_VARIABLE, "").strip()
    if not value:
        return SERVE_MAX_TOKENS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"{SERVE_MAX_TOKENS_VARIABLE}={value!r}: expected a positive whole number of tokens, such as 512"
        )
    return int(value)


@dataclass
class ServiceConfig:
    host: str = field(
        default="127.0.0.1",
        metadata={"help": "FLYWHEEL_API_HOST: the address to bind; loopback unless told otherwise."},
    )
    port: int = field(default=8765, metadata={"help": "FLYWHEEL_API_PORT."})
    token: str = field(
        default="",
        metadata={"help": "FLYWHEEL_API_TOKEN: the bearer token writes need; empty = one made at start and printed."},
    )
    token_generated: bool = field(
        default=False, metadata={"help": "True when the token was made at start (printed once)."}
    )
    max_body_bytes: int = field(default=MAX_BODY_BYTES, metadata={"help": "Larger request bodies get a 413, unread."})
    session_ttl_s: int = field(default=SESSION_TTL_S, metadata={"help": "How long a page's sign-in lasts."})
    dagster_url: str = field(
        default="",
        metadata={
            "help": "FLYWHEEL_DAGSTER_URL: the Dagster webserver runs are submitted to "
            "(GraphQL; its daemon launches them); empty = the service's own worker process "
            "executes them on $DAGSTER_HOME's instance."
        },
    )
    serve_max_tokens: int = field(
        default=SERVE_MAX_TOKENS,
        metadata={
            "help": "FLYWHEEL_SERVE_MAX_TOKENS: the most tokens one "
            "/v1/chat/completions reply may generate (max_tokens above it: 400)."
        },
    )

    def __post_init__(self):
        if self.dagster_url:
            self.dagster_url = check_dagster_url(self.dagster_url)
        if (
            isinstance(self.serve_max_tokens, bool)
            or not isinstance(self.serve_max_tokens, int)
            or self.serve_max_tokens < 1
        ):
            raise ValueError(
                f"{SERVE_MAX_TOKENS_VARIABLE}={self.serve_max_tokens!r}: expected a positive whole number of tokens, such as 512"
            )
        if not self.token:
            # Like notebook servers: a fresh random token per start, printed with the page's URL.
            self.token = secrets.token_urlsafe(24)
            self.token_generated = True

    @classmethod
    def from_env(cls) -> "ServiceConfig":
        return cls(
            host=env("FLYWHEEL_API_HOST"),
            port=int(env("FLYWHEEL_API_PORT")),
            token=env("FLYWHEEL_API_TOKEN", ""),
            dagster_url=os.environ.get(DAGSTER_URL_VARIABLE, ""),
            serve_max_tokens=serve_max_tokens_from_env(),
        )

    def derived(self, purpose: str) -> str:
        """A value derived from the token (a session's signature, its CSRF field, a message's
        signature): a browser never holds the token itself."""
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    def matches(self, candidate: str | None, purpose: str) -> bool:
        """`candidate` is `derived(purpose)`, compared in constant time."""
        return bool(candidate) and hmac.compare_digest(
            candidate.encode("utf-8", "replace"), self.derived(purpose).encode()
        )

    def is_token(self, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(candidate.encode("utf-8", "replace"), self.token.encode())

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_NAMES

    @property
    def allowed_hosts(self) -> list[str]:
        """The Host headers answered (Starlette's TrustedHostMiddleware): the configured host and the
        loopback names, so a page of another site whose name was rebound to 127.0.0.1 gets a 400.
        Bound to every interface (0.0.0.0), the service cannot know its names and answers any."""
        if self.host in WILDCARD_HOSTS:
            return ["*"]
        return list(dict.fromkeys([self.host, *LOOPBACK_NAMES]))

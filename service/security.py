"""Who may write, and how much: one ASGI middleware in front of every route.

- `POST /api/...` needs `Authorization: Bearer <FLYWHEEL_API_TOKEN>`; without it: 401, unread.
- A page's form post (any other POST, `/login` aside) needs the session cookie `POST /login` set:
  its issue time and a random id, signed with an HMAC of the token, checked in constant time and
  refused once older than `session_ttl_s` (HttpOnly, SameSite=Strict, Secure when not on loopback).
  Each form also carries a CSRF field derived from that session, which the route checks (`require_csrf`).
- A body over `max_body_bytes` gets a 413 before any handler sees it, whatever Content-Length says.
- A JSON body with a lone UTF-16 surrogate in any string (`"\\ud800"`) gets a 422 naming the field
  (a 400 under /v1) before any handler sees it: no model, tokenizer or log can take such a string.
- A request naming another host (`HostGuard`, Starlette's check) gets a 400: plain text, OpenAI's
  shape under /v1.
Refusals under /v1 come in OpenAI's error shape (`service.errors.refusal`), whichever layer refuses.
Reads (GET) are open: the service binds to loopback unless told otherwise.
"""

from __future__ import annotations

import secrets
import time

from fastapi import Form, HTTPException, Request
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import cookie_parser

from service.config import ServiceConfig
from service.errors import body_surrogate, is_openai_path, refusal, surrogate_refusal

SESSION_COOKIE = "flywheel_session"
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
OPEN_POSTS = {"/login"}
# Declared on the write routes so the OpenAPI schema shows the lock; the middleware enforces it.
bearer = HTTPBearer(auto_error=False, description="FLYWHEEL_API_TOKEN (printed by the service at start when unset)")


def new_session(config: ServiceConfig, now: float | None = None) -> str:
    """A session cookie's value: `<issued>.<random id>.<HMAC of both under the token>`."""
    body = f"{int(now if now is not None else time.time())}.{secrets.token_hex(16)}"
    return f"{body}.{config.derived('session:' + body)}"


def valid_session(config: ServiceConfig, value: str | None, now: float | None = None) -> bool:
    """Signed by this token (constant-time comparison) and younger than `session_ttl_s`."""
    issued, _, rest = (value or "").partition(".")
    nonce, _, signature = rest.partition(".")
    if not (issued.isdigit() and nonce and config.matches(signature, f"session:{issued}.{nonce}")):
        return False
    age = (now if now is not None else time.time()) - int(issued)
    return -60 <= age < config.session_ttl_s  # a minute of clock skew


def csrf_value(config: ServiceConfig, session: str | None) -> str:
    """The CSRF field of the forms shown to one session (empty without a session)."""
    return config.derived("csrf:" + session) if session else ""


def session_of(request: Request) -> str | None:
    value = request.cookies.get(SESSION_COOKIE)
    return value if valid_session(request.app.state.service.config, value) else None


def logged_in(request: Request) -> bool:
    return session_of(request) is not None


def require_csrf(request: Request, csrf: str = Form(default="")) -> None:
    """A form post's CSRF field must be the one derived from this browser's session."""
    session = session_of(request)
    if session is None or not request.app.state.service.config.matches(csrf, "csrf:" + session):
        raise HTTPException(status_code=403, detail="the form's CSRF field is missing or stale: reload the page")


def _bearer(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class WriteGuard:
    """Auth for writes and the body-size limit, before routing (so a refused request is never parsed)."""

    def __init__(self, app, config: ServiceConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        path = scope["path"]
        # /v1 (with or without a path after it): the OpenAI-compatible API (ServingGuard checked its token already)
        if path == "/api" or path.startswith("/api/") or is_openai_path(path):
            if not self.config.is_token(_bearer(headers)):
                response = refusal(
                    path,
                    401,
                    "writes need Authorization: Bearer <FLYWHEEL_API_TOKEN>",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                return await response(scope, receive, send)
        elif path not in OPEN_POSTS and not valid_session(
            self.config, cookie_parser(headers.get(b"cookie", b"").decode("latin-1")).get(SESSION_COOKIE)
        ):
            response = PlainTextResponse(
                "not signed in, or the session expired: open /login and paste the service's token", status_code=401
            )
            return await response(scope, receive, send)
        limit = self.config.max_body_bytes
        declared = headers.get(b"content-length")
        too_big = refusal(
            path, 413, f"request body over {limit // 1024} KB ({limit} bytes): refused unread", code="request_too_large"
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await too_big(scope, receive, send)
        body, more = b"", True
        while more:  # read it all here (at most `limit` bytes), then hand it on
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await too_big(scope, receive, send)
        surrogate = body_surrogate(body)
        if surrogate is not None:  # refused here, for every route and field: nothing downstream can take it
            return await surrogate_refusal(path, *surrogate)(scope, receive, send)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class HostGuard:
    """Starlette's TrustedHostMiddleware (a request naming another host, DNS rebinding onto loopback,
    gets a 400), its refusal in OpenAI's shape under /v1, as every other /v1 refusal."""

    PASSED = "flywheel.host_passed"

    def __init__(self, app, allowed_hosts: list[str]):
        self.app = app
        self.pages = TrustedHostMiddleware(app, allowed_hosts=allowed_hosts)
        self.check = TrustedHostMiddleware(self._passed, allowed_hosts=allowed_hosts, www_redirect=False)

    async def _passed(self, scope, receive, send):
        scope[self.PASSED] = True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not is_openai_path(scope["path"]):
            return await self.pages(scope, receive, send)

        async def discard(message):  # Starlette's plain-text refusal: replaced below
            pass

        await self.check(scope, receive, discard)
        if scope.pop(self.PASSED, False):
            return await self.app(scope, receive, send)
        response = refusal(
            scope["path"],
            400,
            "Invalid host header: this server answers requests for its own host names only",
            code="invalid_host",
        )
        return await response(scope, receive, send)

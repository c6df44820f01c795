"""Who may write, and how much: one ASGI middleware in front of every route.

- `POST /api/...` needs `Authorization: Bearer <FLYWHEEL_API_TOKEN>`; without it: 401, unread.
- A page's form post (any other POST, `/login` aside) needs the session cookie `/login` set (a value
  derived from the token, HttpOnly, SameSite=Strict); each form also carries a CSRF field that the
  route checks (`require_csrf`).
- A body over `max_body_bytes` gets a 413 before any handler sees it, whatever Content-Length says.
Reads (GET) are open: the service binds to loopback unless told otherwise.
"""

from __future__ import annotations

from fastapi import Form, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.requests import cookie_parser

from service.config import ServiceConfig

SESSION_COOKIE = "flywheel_session"
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
OPEN_POSTS = {"/login"}
# Declared on the write routes so /docs shows the lock and its "Authorize" button; the middleware enforces it.
bearer = HTTPBearer(auto_error=False, description="FLYWHEEL_API_TOKEN (printed by the service at start when unset)")


def session_value(config: ServiceConfig) -> str:
    return config.derived("session")


def csrf_value(config: ServiceConfig) -> str:
    return config.derived("csrf")


def logged_in(request: Request) -> bool:
    config: ServiceConfig = request.app.state.service.config
    cookie = request.cookies.get(SESSION_COOKIE)
    return bool(cookie) and cookie == session_value(config)


def require_csrf(request: Request, csrf: str = Form(default="")) -> None:
    """A form post's CSRF field must be this service's (forms rendered for a logged-in browser carry it)."""
    if csrf != csrf_value(request.app.state.service.config):
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
        if path.startswith("/api/"):
            if not self.config.is_token(_bearer(headers)):
                response = JSONResponse({"detail": "writes need Authorization: Bearer <FLYWHEEL_API_TOKEN>"}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        elif path not in OPEN_POSTS and cookie_parser(headers.get(b"cookie", b"").decode("latin-1")).get(SESSION_COOKIE) != session_value(self.config):
            response = PlainTextResponse("not logged in: open /login and paste the service's token", status_code=401)
            return await response(scope, receive, send)
        limit = self.config.max_body_bytes
        declared = headers.get(b"content-length")
        too_big = JSONResponse({"detail": f"request body over {limit // 1024} KB ({limit} bytes): refused unread"}, status_code=413)
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
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

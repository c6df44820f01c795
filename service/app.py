"""`create_app`: the FastAPI application (REST API under /api, review pages at /, the OpenAPI schema
at /openapi.json)."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from outcome_flywheel.models.serve.serving import ModelServer
from service import launching
from service.api import decisions, feedback, openai_compat, preferences, rl
from service.errors import is_openai_path, refusal
from service.pages import routes as pages
from service.security import HostGuard, WriteGuard
from service.state import NoDagsterInstance, ServiceState

DESCRIPTION = """People in the loop of the outcome flywheel.

* **Decisions** an operator takes on rebalance proposals go to the live audit log; **extract** and
  **train** launch the flywheel's jobs on the Dagster instance.
* **Feedback** on the daily notes (thumbs, stars, corrections) and its **curation**.
* **Status** and **history** of both loops.
* **OpenAI-compatible** serving of the trained models under `/v1` (`policy`, `preference`), hot-swapped
  when a newly accepted checkpoint or adapter is published.

Writes (every POST) need `Authorization: Bearer <FLYWHEEL_API_TOKEN>`; reads are open, except under
`/v1`, where every request needs it (generation spends the machine's compute).
Request bodies over 64 KB are refused (413), and so is any JSON body with a lone UTF-16 surrogate in a
string (422; 400 under `/v1`). Errors under `/v1` come in OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`. The review pages are at `/`.
"""


def create_app(state: ServiceState | None = None) -> FastAPI:
    state = state or ServiceState.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Runs whose worker died while the service was down are failed (and their pool slots freed) now.
        try:
            launching.reconcile(state)
        except NoDagsterInstance:
            pass  # launching will say why not
        yield

    # No Swagger UI or ReDoc: both load scripts from a CDN into the page where operators would paste
    # the token. The schema stays at /openapi.json for any client or viewer a person trusts.
    app = FastAPI(
        title="outcome-flywheel",
        version="0.1.0",
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.service = state
    # The models are loaded on the first /v1 request, not here: the review pages start without them.
    app.state.serving = ModelServer(state.scorer.loader, state.warehouse.root, max_tokens=state.config.serve_max_tokens)
    for module in (decisions, preferences, feedback, rl, openai_compat):
        app.include_router(module.router)
    app.include_router(pages.router)
    app.add_middleware(WriteGuard, config=state.config)
    app.add_middleware(
        openai_compat.ServingGuard, config=state.config
    )  # outside WriteGuard: /v1 reads need the token too
    # Outermost: a request naming another host (DNS rebinding onto loopback) is refused before anything else.
    app.add_middleware(HostGuard, allowed_hosts=state.config.allowed_hosts)

    # Every refusal below answers in the shape of its path's clients (`service.errors.refusal`):
    # `{"detail": ...}` under /api and the pages, OpenAI's `{"error": {...}}` under /v1.
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        # The reasons without the refused input: echoing it back could be megabytes, or nested past
        # what the JSON encoder can recurse through.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in err.errors()
        ]
        path = request.url.path
        if is_openai_path(path):  # /v1 answers an invalid field with a 400 naming it, as OpenAI does
            param = (".".join(str(p) for p in errors[0]["loc"][1:]) or None) if errors else None
            return refusal(path, 400, errors, param=param)
        return refusal(path, 422, errors)

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, err: RecursionError):
        path = request.url.path
        return refusal(path, 400 if is_openai_path(path) else 422, "the request nests objects or lists too deeply")

    @app.exception_handler(FileNotFoundError)
    async def missing_file(request: Request, err: FileNotFoundError):
        # A configured file that is not there (FLYWHEEL_AUDIT_LOG, the base model, an adapter folder):
        # the service cannot answer until it is fixed, and says which file.
        return refusal(request.url.path, 503, str(err))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):
        # A bug or a broken file nothing expected: Starlette's plain "Internal Server Error" (the
        # traceback goes to the log), in OpenAI's shape under /v1, never the error's own text.
        # The server closes the connection after it (the error is re-raised to its log): the client is told.
        path, headers = request.url.path, {"Connection": "close"}
        if not is_openai_path(path):
            return PlainTextResponse("Internal Server Error", status_code=500, headers=headers)
        return refusal(
            path,
            500,
            f"internal server error ({type(err).__name__}); the service's log has the details",
            code="internal_error",
            headers=headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        # FastAPI's own answer everywhere but /v1: there an unknown path or method (404, 405) and any
        # HTTPException raised on the way answer in OpenAI's shape, so its clients show the reason.
        path = request.url.path
        if not is_openai_path(path):
            return await http_exception_handler(request, err)
        if err.status_code == 404 and err.detail == "Not Found":
            message, code = (
                (
                    f"{request.method} {path} is not an endpoint of this server: it serves GET /v1/models, "
                    "GET /v1/models/{model}, POST /v1/chat/completions"
                ),
                "unknown_url",
            )
        elif err.status_code == 405:
            message, code = f"{request.method} is not allowed on {path}", "method_not_allowed"
        else:
            message, code = err.detail, None
        return refusal(path, err.status_code, message, code=code, headers=getattr(err, "headers", None))

    return app

"""`create_app`: the FastAPI application (REST API under /api, review pages at /, OpenAPI at /docs)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.api import decisions, feedback, preferences, rl
from service.pages import routes as pages
from service.security import WriteGuard
from service.state import ServiceState

DESCRIPTION = """People in the loop of the outcome flywheel.

* **Decisions** an operator takes on rebalance proposals go to the live audit log; **extract** and
  **train** launch the flywheel's jobs on the Dagster instance.
* **Feedback** on the daily notes (thumbs, stars, corrections) and its **curation**.
* **Status** and **history** of both loops.

Writes (every POST) need `Authorization: Bearer <FLYWHEEL_API_TOKEN>` (use *Authorize*); reads are open.
Request bodies over 64 KB are refused (413). The review pages are at `/`.
"""


def create_app(state: ServiceState | None = None) -> FastAPI:
    state = state or ServiceState.from_env()
    app = FastAPI(title="outcome-flywheel", version="0.1.0", description=DESCRIPTION)
    app.state.service = state
    for module in (decisions, preferences, feedback, rl):
        app.include_router(module.router)
    app.include_router(pages.router)
    app.add_middleware(WriteGuard, config=state.config)

    @app.exception_handler(FileNotFoundError)
    async def missing_file(request: Request, err: FileNotFoundError):
        # A configured file that is not there (FLYWHEEL_AUDIT_LOG, the base model, an adapter folder):
        # the service cannot answer until it is fixed, and says which file.
        return JSONResponse({"detail": str(err)}, status_code=503)

    return app

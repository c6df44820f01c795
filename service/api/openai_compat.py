"""The trained models over OpenAI's chat API: `POST /v1/chat/completions`, `GET /v1/models`.

Model ids: `policy` (the latest accepted policy checkpoint of the daily loop) and `preference` (the
base model with the latest preference adapter), hot-swapped as their `latest` pointers move
(`outcome_flywheel.models.serve.serving.ModelServer`). Every /v1 request, reads included, needs
`Authorization: Bearer <FLYWHEEL_API_TOKEN>` (the key an OpenAI client sends): serving spends the
machine's compute. Errors come in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
with a 4xx status for a request the server cannot take: this module's own, and those the guards and
the app answer before or around it (401, 413, a lone surrogate, an unknown path or method; see
`service.errors`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from outcome_flywheel.models.serve.serving import MODEL_IDS, ModelServer, ModelUnavailable
from service.errors import openai_error
from service.security import _bearer, bearer

# Declared so the OpenAPI schema shows the lock on every /v1 route; ServingGuard enforces it.
router = APIRouter(prefix="/v1", tags=["openai-compatible"], dependencies=[Depends(bearer)])
VERSION_HEADER = "X-Flywheel-Model-Version"
# Fields of OpenAI's request this server does not implement: refused rather than silently ignored.
UNSUPPORTED = (
    "stream",
    "tools",
    "tool_choice",
    "functions",
    "stop",
    "logprobs",
    "top_logprobs",
    "response_format",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]

    def as_template(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send optional fields; the ones that matter are checked

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = 1
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says (benchmarks)

    def unsupported(self) -> str | None:
        extra = self.model_extra or {}
        for name in UNSUPPORTED:
            value = extra.get(name)
            if value not in (None, False, [], {}, 0, 0.0) and not (
                name == "response_format" and value == {"type": "text"}
            ):
                return name
        return None


def bearer_error() -> JSONResponse:
    return openai_error(
        401,
        "the OpenAI-compatible API needs Authorization: Bearer <FLYWHEEL_API_TOKEN> (as the client's api_key)",
        "invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


class ServingGuard:
    """Every /v1 request needs the service's bearer token, GETs too: a 401 in OpenAI's shape before
    routing (outside `WriteGuard`, which then applies the body-size limit to the POSTs)."""

    def __init__(self, app, config):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope["path"] == "/v1" or scope["path"].startswith("/v1/")):
            if not self.config.is_token(_bearer(dict(scope["headers"]))):
                return await bearer_error()(scope, receive, send)
        return await self.app(scope, receive, send)


def _server(request: Request) -> ModelServer:
    return request.app.state.serving


def _model_card(candidate, loaded) -> dict[str, Any]:
    return {
        "id": candidate.model_id,
        "object": "model",
        "created": int(candidate.folder.stat().st_mtime),
        "owned_by": "outcome-flywheel",
        "version": candidate.version,
        "source": str(candidate.folder),
        "kind": candidate.kind,
        "loaded_version": loaded.version if loaded else None,
    }


@router.get("/models", summary="The served models (OpenAI's list)")
def list_models(request: Request):
    """The model ids with something to serve now, each with the version a request would get
    (`version`) and the one in memory (`loaded_version`; they differ until the next request loads it)."""
    server = _server(request)
    return {"object": "list", "data": [_model_card(c, server.loaded(c.model_id)) for c in server.available()]}


@router.get("/models/{model_id}", summary="One served model")
def get_model(model_id: str, request: Request):
    server = _server(request)
    try:
        candidate = server.resolve(model_id)
    except KeyError:
        return openai_error(
            404,
            f"the model {model_id!r} does not exist: this server serves {', '.join(MODEL_IDS)}",
            code="model_not_found",
        )
    except ModelUnavailable as err:
        return openai_error(404, str(err), code="model_not_found")
    return _model_card(candidate, server.loaded(model_id))


@router.post("/chat/completions", summary="A chat completion from the policy or the preference model")
async def chat_completions(request: Request):
    """OpenAI's chat completion, non-streaming, one choice: `messages`, `max_tokens` (at most
    FLYWHEEL_SERVE_MAX_TOKENS; default the cap or what the context leaves), `temperature` (0 =
    greedy), `top_p`, `seed` (same seed, same reply), `n` = 1. `system_fingerprint` and the
    X-Flywheel-Model-Version header name the weights that wrote the reply."""
    try:
        body = await request.json()
    except ValueError:
        return openai_error(400, "the request body is not valid JSON")
    except RecursionError:
        return openai_error(400, "the request body nests objects or lists too deeply")
    if not isinstance(body, dict):
        return openai_error(400, f"the request body must be a JSON object, not a {type(body).__name__}")
    try:
        chat = ChatRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        return openai_error(
            400,
            f"{param or 'body'}: {first.get('msg')}"
            + (f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""),
            param=param,
        )
    if chat.n != 1:
        return openai_error(400, f"n={chat.n}: this server writes one choice per request (n=1)", param="n")
    if (name := chat.unsupported()) is not None:
        return openai_error(
            400, f"{name} is not supported by this server (non-streaming text completions only)", param=name
        )
    server = _server(request)
    try:
        server.resolve(chat.model)
    except KeyError:
        return openai_error(
            404,
            f"the model {chat.model!r} does not exist: this server serves {', '.join(MODEL_IDS)}",
            param="model",
            code="model_not_found",
        )
    except ModelUnavailable as err:
        return openai_error(503, str(err), "server_error", param="model", code="model_not_available")
    max_tokens = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
    try:
        # Loading (after a swap) and generating are blocking torch work: off the event loop.
        done = await run_in_threadpool(
            server.generate,
            chat.model,
            [m.as_template() for m in chat.messages],
            max_tokens,
            chat.temperature,
            chat.top_p,
            chat.seed,
            chat.ignore_eos,
        )
    except ValueError as err:
        return openai_error(400, str(err), param="max_tokens" if "max_tokens" in str(err) else "messages")
    except (
        ModelUnavailable,
        FileNotFoundError,
    ) as err:  # FileNotFoundError: the base model is not built (base_model asset)
        return openai_error(503, str(err), "server_error", param="model", code="model_not_available")
    reply = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "system_fingerprint": done.version,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done.text},
                "finish_reason": done.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        },
    }
    return JSONResponse(reply, headers={VERSION_HEADER: done.version})

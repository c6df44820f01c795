"""How the service refuses a request, and the one check every body's text passes.

- `refusal`: FastAPI's `{"detail": ...}` under `/api` and the pages; OpenAI's
  `{"error": {"message", "type", "param", "code"}}` under `/v1`, so an OpenAI client shows the reason,
  not only the status code.
- `lone_surrogate`: where a decoded JSON value holds a string with a lone UTF-16 surrogate
  (`"\\ud800"`, valid JSON, not Unicode text: no UTF-8 encoder, tokenizer or log takes it).
  `WriteGuard` runs it on every JSON body before routing (`service.security`), and the pages run it
  on the JSON people type into a form (`service.pages.forms.parse_context`), so no endpoint and no
  field (a key, an `Any`-typed context) can miss it.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

OPENAI_PREFIX = "/v1"
SURROGATE_TYPE = "string_unicode"  # pydantic's error type for a string that is not Unicode text


def is_openai_path(path: str) -> bool:
    return path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")


def openai_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape (what its clients parse into their exceptions' message, param and code)."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status, headers=headers
    )


def detail_text(detail: Any) -> str:
    """A `detail` (a string, pydantic's list of errors, a dict) as one line."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" if isinstance(e, dict) else str(e)
            for e in detail
        )
    if isinstance(detail, dict) and "message" in detail:
        return str(detail["message"])
    return json.dumps(detail, default=str)


def refusal(
    path: str,
    status: int,
    detail: Any,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict | None = None,
) -> JSONResponse:
    """The answer to a request refused with `status`, in the shape its path's clients read."""
    if is_openai_path(path):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return openai_error(status, detail_text(detail), kind, param=param, code=code, headers=headers)
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _surrogate_at(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def lone_surrogate(value: Any) -> tuple[tuple[Any, ...], str] | None:
    """(where, why) for the first string of a decoded JSON value (keys included) that holds a lone
    UTF-16 surrogate, or None. `where` is the path to it (keys and list indices; for a key, the path
    to its object). Iterative: a value nested as deep as the parser allows does not recurse."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            at = _surrogate_at(item)
            if at is not None:
                return loc, surrogate_message(item, at)
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                at = _surrogate_at(key)
                if at is not None:
                    return loc, surrogate_message(key, at, key=True)
                children.append((loc + (key,), child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(loc + (i,), child) for i, child in enumerate(item)]))
    return None


def surrogate_message(text: str, at: int, key: bool = False) -> str:
    """Why: the code point and where it is, never the refused text itself."""
    what = "a key of this object" if key else "the string"
    return (
        f"{what} holds a lone UTF-16 surrogate (U+{ord(text[at]):04X} at character {at}), which is not Unicode text: "
        "send the character whole (a surrogate pair in JSON's \\u escapes) or leave it out"
    )


def body_surrogate(body: bytes) -> tuple[tuple[Any, ...], str] | None:
    """`lone_surrogate` of a request body, decoded as the routes decode it (`json.loads` on the bytes:
    UTF-8, -16 or -32, surrogates passed through); None for a body that is not JSON (its route says why)."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return lone_surrogate(value)


def surrogate_refusal(path: str, loc: tuple[Any, ...], message: str) -> JSONResponse:
    """422 with pydantic's error shape under /api (`loc` from `body`); under /v1 a 400 in OpenAI's
    shape with `param` naming the field, as its other invalid fields get."""
    if is_openai_path(path):
        param = ".".join(str(p) for p in loc) or None
        return openai_error(400, f"{param or 'body'}: {message}", param=param, code="invalid_unicode")
    return JSONResponse({"detail": [{"loc": ["body", *loc], "msg": message, "type": SURROGATE_TYPE}]}, status_code=422)

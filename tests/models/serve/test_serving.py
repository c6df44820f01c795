"""The trained models served over OpenAI's chat API (`/v1`), checked with the `openai` client against the
service in uvicorn on a free 127.0.0.1 port: completions from the policy and the preference model,
the bearer token on reads and writes, OpenAI-shaped 4xx errors, the token cap, and the hot swap: when
`latest` moves to a newly accepted checkpoint the next request gets the new weights while a request
started before finishes on the old ones; a rejected day and an unverified re-run never reach it."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from outcome_flywheel.models.serve.serving import tier_summary
from outcome_flywheel.storage import atomic_symlink
from service.config import ServiceConfig
from service.main import start_in_thread
from tests.service_fixtures import TOKEN, make_state, publish_adapter
from tests.serving_fixtures import PolicyPublisher, tiny_root

CAP = 400  # FLYWHEEL_SERVE_MAX_TOKENS of the test service: long enough for a request to still run during a swap
MESSAGES = [
    {"role": "system", "content": "You write trading notes."},
    {"role": "user", "content": "Write a trading note on: chips rally"},
]
LONE = "\ud800 hi"  # a lone UTF-16 surrogate: JSON can carry it (as the escape), Unicode text cannot


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny_model_dir):
    """The service with one accepted policy checkpoint and one preference adapter, in a thread on a free port."""
    root = tiny_root(tmp_path_factory.mktemp("serving"), tiny_model_dir)
    publisher = PolicyPublisher(root)
    first = publisher.publish("2025-11-03", seed=1)
    publish_adapter(root, "run-1", seed=5)
    with pytest.MonkeyPatch.context():
        state = make_state(root)
        state.config.serve_max_tokens = CAP
        server, url = start_in_thread(state)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=300)
        yield {
            "root": root,
            "url": url,
            "client": client,
            "publisher": publisher,
            "first": first,
            "serving": server.config.app.state.serving,
        }
        server.should_exit = True


def test_models_are_listed_with_the_versions_they_serve(live):
    models = {m.id: m for m in live["client"].models.list().data}
    assert set(models) == {"policy", "preference"}
    assert models["policy"].version == live["first"]["policy_version"]
    assert models["preference"].version.startswith("preference:run-1@")
    assert live["client"].models.retrieve("policy").id == "policy"
    with pytest.raises(openai.NotFoundError):
        live["client"].models.retrieve("gpt-4")


def test_a_completion_from_the_policy(live):
    raw = live["client"].chat.completions.with_raw_response.create(
        model="policy", messages=MESSAGES, max_tokens=24, temperature=0
    )
    reply = raw.parse()
    version = live["first"]["policy_version"]
    assert reply.system_fingerprint == version and raw.headers["x-flywheel-model-version"] == version
    assert reply.model == "policy" and reply.object == "chat.completion" and len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert (
        usage.prompt_tokens > 10
        and 1 <= usage.completion_tokens <= 24
        and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    )
    # A seed makes a sampled reply repeatable; another seed samples another one.
    again = [
        live["client"]
        .chat.completions.create(model="policy", messages=MESSAGES, max_tokens=24, temperature=1.0, seed=s)
        .choices[0]
        .message.content
        for s in (7, 7, 8)
    ]
    assert again[0] == again[1] and again[0] != again[2]


def test_a_completion_from_the_preference_model(live):
    reply = live["client"].chat.completions.create(
        model="preference", messages=MESSAGES[1:], max_tokens=12, temperature=0
    )
    assert reply.system_fingerprint.startswith("preference:run-1@") and reply.usage.completion_tokens >= 1


def test_anonymous_and_wrong_tokens_get_401_on_reads_and_writes(live):
    stranger = openai.OpenAI(base_url=f"{live['url']}/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        response = httpx.request(method, live["url"] + path, json={"model": "policy", "messages": MESSAGES})
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ("{not json", 400, None),
        ([1, 2], 400, None),
        ({"model": "policy"}, 400, "messages"),
        ({"model": "policy", "messages": []}, 400, "messages"),
        ({"model": "policy", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
        ({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "temperature": 5}, 400, "temperature"),
        ({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}, 400, "stream"),
        ({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
        # A lone UTF-16 surrogate: valid JSON (the escape), not text; the tokenizer raised on it (a 500).
        (json.dumps({"model": "policy", "messages": [{"role": "user", "content": LONE}]}), 400, "messages.0.content"),
        (
            json.dumps(
                {"model": "policy", "messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]}
            ),
            400,
            "messages.0.content.0.text",
        ),
        (json.dumps({"model": "policy", "messages": MESSAGES, "user": {LONE: 1}}), 400, "user"),
        (
            '{"model": "policy", "messages": ' + "[" * 5000 + "]" * 5000 + "}",
            400,
            None,
        ),  # deeper than the parser's stack
        ('{"model": "policy", "messages": [{"role": "user", "content": "' + "x" * 70_000 + '"}]}', 413, None),
    ],
)
def test_garbage_gets_a_4xx_in_openais_shape(live, body, status, param):
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    response = httpx.post(
        live["url"] + "/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60, **kwargs
    )
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and error["param"] == param


def test_the_openai_client_shows_the_reason_of_every_refusal(live):
    """The client reads `error.message` (and `code`, `param`): with `{"detail": ...}` it showed only the
    status code. A lone surrogate is sent as the bytes a client would put on the wire (this client
    cannot encode one itself: it refuses with a UnicodeEncodeError before sending)."""
    client = live["client"]
    with pytest.raises(UnicodeEncodeError):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": LONE}], max_tokens=4)
    lone = {"model": "policy", "messages": [{"role": "user", "content": LONE}], "max_tokens": 4}
    for wire in (json.dumps(lone).encode(), json.dumps(lone).encode().replace(b"\\ud800", b"\xed\xa0\x80")):
        with pytest.raises(openai.BadRequestError, match="messages.0.content: .*lone UTF-16 surrogate") as bad:
            client.post("/chat/completions", cast_to=object, body=wire)
        assert bad.value.param == "messages.0.content" and bad.value.code == "invalid_unicode"
    with pytest.raises(openai.APIStatusError, match="413 - request body over 64 KB") as big:
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x" * 70_000}], max_tokens=4
        )
    assert big.value.status_code == 413 and big.value.code == "request_too_large"
    with pytest.raises(openai.NotFoundError, match="POST /v1/completions is not an endpoint of this server") as unknown:
        client.completions.create(model="policy", prompt="hi", max_tokens=4)
    assert unknown.value.code == "unknown_url"
    with pytest.raises(openai.APIStatusError, match="405 - GET is not allowed on /v1/chat/completions"):
        client.get("/chat/completions", cast_to=object)
    with pytest.raises(openai.BadRequestError, match="nests objects or lists too deeply"):
        client.post(
            "/chat/completions", cast_to=object, body=('{"messages": ' + "[" * 5000 + "]" * 5000 + "}").encode()
        )
    # Anonymous, the same bodies get the 401, in the same shape, before anything reads them.
    stranger = openai.OpenAI(base_url=f"{live['url']}/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="needs Authorization: Bearer"):
        stranger.post("/chat/completions", cast_to=object, body=json.dumps(lone).encode())


def test_the_token_cap(live):
    client = live["client"]
    with pytest.raises(openai.BadRequestError, match=f"cap of {CAP} tokens"):
        client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=CAP + 1)
    # ignore_eos (vLLM's extension): the reply runs to the budget, and stops there.
    reply = client.chat.completions.create(
        model="policy", messages=MESSAGES, max_tokens=9, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 9 and reply.choices[0].finish_reason == "length"
    # Over the model's context (tiny-local: 1024 tokens) is refused with the numbers.
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "chips rally " * 900}], max_tokens=CAP
        )


def test_hot_swap_new_requests_get_new_weights_in_flight_ones_finish_on_the_old(live):
    client, serving, publisher = live["client"], live["serving"], live["publisher"]
    old = live["first"]["policy_version"]
    assert client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint == old
    # Day 2 is published but not yet verified: `latest` has not moved, nothing changes.
    new = publisher.publish("2025-11-04", seed=2, verify=False)["policy_version"]
    assert (
        new != old
        and client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint == old
    )

    started: dict = {}

    def long_request():
        started["reply"] = client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=CAP, extra_body={"ignore_eos": True}
        )
        started["done_at"] = time.monotonic()

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 60
    while serving.in_flight().get(old, 0) < 1:
        assert time.monotonic() < deadline, "the long request never started generating"
        time.sleep(0.02)

    publisher.verify("2025-11-04")  # `latest` moves now, while the old weights are generating
    moved_at = time.monotonic()
    assert serving.in_flight().get(old) == 1
    swapped = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8)
    swapped_at = time.monotonic()
    still_running = serving.in_flight().get(old) == 1
    thread.join(timeout=600)

    assert swapped.system_fingerprint == new  # the next request: the new weights, no restart
    assert started["reply"].system_fingerprint == old  # the one in flight: the old weights, to its last token
    assert started["reply"].usage.completion_tokens == CAP and started["done_at"] > moved_at
    assert still_running and started["done_at"] > swapped_at, (
        "the new model answered while the old one was still generating"
    )
    assert serving.loads[-1]["version"] == new and serving.loads[-1]["replaced"] == old
    assert {m.id: m.version for m in client.models.list().data}["policy"] == new


def test_a_rejected_day_and_an_unverified_rerun_never_reach_the_served_model(live):
    client, serving, publisher = live["client"], live["serving"], live["publisher"]
    served = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint
    loads = len(serving.loads)
    # The gate rejected day 3: `latest` moves to a republished copy of day 2, same weights, no reload.
    rejected = publisher.reject("2025-11-05")
    assert (publisher.ckpt_root / "latest").resolve().name == "2025-11-05" and rejected["policy_version"] == served
    assert client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint == served
    # Day 4 re-run: other weights, not verified, and `latest` names it (a re-run republishes under the pointer).
    unverified = publisher.publish("2025-11-06", seed=3, verify=False)["policy_version"]
    atomic_symlink(publisher.ckpt_root / "2025-11-06", publisher.ckpt_root / "latest")
    assert (
        client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint
        == served
        != unverified
    )
    assert len(serving.loads) == loads
    summary = tier_summary(live["root"])
    assert f"policy = {served}" in summary and "1 rejected" in summary and "1 unverified" in summary


def test_a_distilled_checkpoint_named_by_latest_is_served(live):
    # The distillation tier publishes `<parent day>.distill-<run>` and moves `latest` once it is verified.
    client, publisher = live["client"], live["publisher"]
    distilled = publisher.publish("2025-11-06.distill-r1", seed=4)["policy_version"]
    assert (publisher.ckpt_root / "latest").resolve().name == "2025-11-06.distill-r1"
    assert (
        client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4).system_fingerprint == distilled
    )


def test_a_new_preference_adapter_is_swapped_in(live):
    client = live["client"]
    before = client.chat.completions.create(model="preference", messages=MESSAGES, max_tokens=4).system_fingerprint
    publish_adapter(live["root"], "run-2", seed=6)
    after = client.chat.completions.create(model="preference", messages=MESSAGES, max_tokens=4).system_fingerprint
    assert before.startswith("preference:run-1@") and after.startswith("preference:run-2@")


def test_nothing_to_serve_yet_is_a_503_that_says_why(tmp_path, tiny_model_dir):
    from tests.service_fixtures import AUTH, test_client

    root = tiny_root(tmp_path, tiny_model_dir)
    client = test_client(make_state(root))
    assert client.get("/v1/models", headers=AUTH).json() == {"object": "list", "data": []}
    response = client.post("/v1/chat/completions", headers=AUTH, json={"model": "policy", "messages": MESSAGES})
    assert response.status_code == 503 and response.json()["error"]["code"] == "model_not_available"
    assert "no verified, accepted policy checkpoint" in response.json()["error"]["message"]
    assert client.get("/v1/models/preference", headers=AUTH).status_code == 404
    assert "none yet" in tier_summary(root)


def test_the_token_cap_setting(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_SERVE_MAX_TOKENS", "64")
    monkeypatch.setenv("FLYWHEEL_API_TOKEN", TOKEN)
    assert ServiceConfig.from_env().serve_max_tokens == 64
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv("FLYWHEEL_SERVE_MAX_TOKENS", bad)
        with pytest.raises(ValueError, match="FLYWHEEL_SERVE_MAX_TOKENS"):
            ServiceConfig.from_env()

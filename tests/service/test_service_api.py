"""The service's REST API on a small world (tests/service_fixtures.py): every write needs the
token; bad requests get a 4xx with the reason and write nothing; decisions are idempotent by id;
feedback and curation round-trip through the log; the style score keeps its model and reloads
when `latest` moves."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from outcome_flywheel.feedback.log import read_feedback_log
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG
from outcome_flywheel.preferences.weighting import PAIR_COLUMNS
from tests.service_fixtures import AUTH, DAY, HEADLINES, make_state, publish_adapter, test_client

GOOD = {"date": DAY, "headline_id": HEADLINES[0], "rollout_index": 1, "thumbs": "up", "stars": 4, "reviewer": "ana"}
DECISION = {
    "decision_id": "web-0001",
    "ts": "2025-06-10T10:00:00-04:00",
    "decision": "approve",
    "proposal": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}], "text": "Cash deployment."},
    "context": {"regime": "risk-on"},
}


def _bytes(path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def test_openapi_lists_every_endpoint_and_docs_answer(client):
    paths = client.get("/openapi.json").json()["paths"]
    expected = {
        ("/api/decisions", "post"),
        ("/api/preferences/extract", "post"),
        ("/api/preferences/stats", "get"),
        ("/api/preferences/dataset", "get"),
        ("/api/preferences/training_status", "get"),
        ("/api/preferences/train", "post"),
        ("/api/preferences/style_score", "post"),
        ("/api/feedback", "post"),
        ("/api/feedback", "get"),
        ("/api/feedback/{feedback_id}/verify", "post"),
        ("/api/feedback/materialize", "post"),
        ("/api/rl/status", "get"),
        ("/api/rl/history", "get"),
    }
    assert expected <= {(p, m) for p, ops in paths.items() for m in ops}
    assert paths["/api/decisions"]["post"]["security"]  # the schema shows the lock on writes
    # No Swagger UI / ReDoc: they load scripts from a CDN into the page where the token is pasted.
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/api/decisions",
        "/api/feedback",
        "/api/preferences/extract",
        "/api/preferences/train?dry_run=false",
        "/api/preferences/style_score",
        "/api/feedback/" + "0" * 32 + "/verify",
        "/api/feedback/materialize",
    ],
)
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong-token-000000000"}, {"Authorization": "Basic abc"}]
)
def test_every_write_without_the_token_is_401_and_writes_nothing(client, world, path, headers):
    feedback, live = client.app.state.service.feedback_log.file, client.app.state.service.audit_log.live_file
    response = client.post(path, json=GOOD if "feedback" in path else DECISION, headers=headers)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert "FLYWHEEL_API_TOKEN" in response.json()["detail"]
    assert not feedback.exists() and not live.exists()


def test_feedback_then_curation_round_trip(client):
    made = client.post("/api/feedback", json={**GOOD, "correction": "Buy NVDA, 2% of the portfolio."}, headers=AUTH)
    assert made.status_code == 201, made.text
    feedback_id = made.json()["feedback_id"]
    queue = client.get("/api/feedback", params={"status": "unverified"}).json()
    assert queue["n"] == 1 and queue["feedback"][0]["feedback_id"] == feedback_id
    verdict = client.post(
        f"/api/feedback/{feedback_id}/verify",
        json={"action": "edit", "correction": "Buy NVDA, 1%.", "curator": "cu"},
        headers=AUTH,
    )
    assert verdict.status_code == 201, verdict.text
    edited = client.get("/api/feedback", params={"status": "edited"}).json()["feedback"]
    assert [f["verified_correction"] for f in edited] == ["Buy NVDA, 1%."]
    assert client.get("/api/feedback").json()["n"] == 0  # the queue is empty again


@pytest.mark.parametrize(
    "body,code,needle",
    [
        ({**GOOD, "correction": "x" * 70_000}, 413, "64 KB"),  # a body over 64 KB
        ({**GOOD, "correction": "x" * 1_000_000}, 413, "64 KB"),  # a 1 MB correction
        ({**GOOD, "correction": "x" * 9_000}, 422, "correction"),  # under 64 KB, over the 8,000-character field
        ({**GOOD, "date": "2025-13-40"}, 422, "date"),
        ({**GOOD, "stars": 9}, 422, "stars"),
        ({**GOOD, "rollout_index": 8}, 422, "rollout_index"),
        ({**GOOD, "extra": 1}, 422, "extra"),
        ({k: v for k, v in GOOD.items() if k not in ("thumbs", "stars")}, 422, "thumbs, stars or a correction"),
        ({**GOOD, "headline_id": "nothere00000"}, 404, "no note"),
        ({**GOOD, "date": "2025-11-05"}, 404, "rollouts(2025-11-05)"),
    ],
)
def test_bad_feedback_gets_a_4xx_with_the_reason_and_writes_nothing(client, body, code, needle):
    log = client.app.state.service.feedback_log.file
    response = client.post("/api/feedback", json=body, headers=AUTH)
    assert response.status_code == code, response.text
    assert needle in response.text
    assert not log.exists() or log.read_text() == ""


def test_malformed_json_and_a_lying_content_length(client):
    log = client.app.state.service.feedback_log.file
    bad = client.post(
        "/api/feedback", content=b'{"date": "2025-11-04",', headers={**AUTH, "Content-Type": "application/json"}
    )
    assert bad.status_code == 422 and "json" in bad.text.lower()
    # Chunked (no Content-Length): the guard still counts the bytes.
    big = client.post(
        "/api/feedback",
        content=iter([b"{" + b" " * 40_000, b" " * 40_000 + b"}"]),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert big.status_code == 413
    assert not log.exists()


def test_verify_refuses_unknown_ids_and_feedback_without_a_correction(client):
    plain = client.post("/api/feedback", json=GOOD, headers=AUTH).json()["feedback_id"]
    log = client.app.state.service.feedback_log.file
    before = log.read_bytes()
    cases = [
        ("f" * 32, {"action": "approve", "curator": "cu"}, 404),
        (plain, {"action": "approve", "curator": "cu"}, 409),
        ("not-an-id", {"action": "approve", "curator": "cu"}, 422),
        (plain, {"action": "edit", "curator": "cu"}, 422),
        (plain, {"action": "approve", "curator": "<b>"}, 422),
    ]
    for feedback_id, body, code in cases:
        assert client.post(f"/api/feedback/{feedback_id}/verify", json=body, headers=AUTH).status_code == code
    assert log.read_bytes() == before


def test_decisions_are_durable_idempotent_and_409_on_a_changed_body(client, world):
    state = client.app.state.service
    sample = hashlib.sha256(BUNDLED_AUDIT_LOG.read_bytes()).hexdigest()
    first = client.post("/api/decisions", json=DECISION, headers=AUTH)
    assert first.status_code == 201 and first.json()["decision_date"] == "2025-06-10"
    again = client.post(
        "/api/decisions", json={**DECISION, "decision": "APPROVE"}, headers=AUTH
    )  # same decision, spelled differently
    assert again.status_code == 200 and again.json()["status"] == "unchanged"
    changed = client.post("/api/decisions", json={**DECISION, "decision": "reject"}, headers=AUTH)
    assert changed.status_code == 409 and "different body" in changed.text
    assert len(state.audit_log.live_file.read_text().splitlines()) == 1
    # An id from the audit log people keep: same body no-op, other body 409, neither written.
    kept = json.loads((world / "audit_log.jsonl").read_text().splitlines()[0])
    assert client.post("/api/decisions", json=kept, headers=AUTH).status_code == 200
    assert client.post("/api/decisions", json={**kept, "reason": "changed my mind"}, headers=AUTH).status_code == 409
    naive = client.post(
        "/api/decisions", json={**DECISION, "decision_id": "web-0002", "ts": "2025-06-10T10:00:00"}, headers=AUTH
    )
    assert naive.status_code == 422 and "UTC offset" in naive.text
    assert len(state.audit_log.live_file.read_text().splitlines()) == 1
    # The assets read both logs as one: the posted decision is there, after the kept ones.
    parsed = state.audit_log.parse()
    assert [r.decision_id for _, r in parsed.records][-1] == "web-0001" and parsed.reconciles()
    assert hashlib.sha256(BUNDLED_AUDIT_LOG.read_bytes()).hexdigest() == sample


def test_stats_and_dataset(client):
    stats = client.get("/api/preferences/stats").json()
    assert stats["n_decisions"] == 3 and {
        "sector_tilts",
        "top_rejected_names",
        "turnover_bias",
        "approval_by_size",
    } <= set(stats)
    assert client.get("/api/preferences/dataset").json() == {"n_pairs": 0, "pairs": []}
    for limit in (0, 501, "x"):
        assert client.get("/api/preferences/dataset", params={"limit": limit}).status_code == 422
    # a pair comes back whole: every column of the table (weighting.PAIR_COLUMNS), newest first
    pairs = pd.DataFrame(
        [{c: f"{c}-{n}" for c in PAIR_COLUMNS} | {"decision_date": f"2025-06-1{n}", "prompt": "[]"} for n in (1, 2)]
    )
    client.app.state.service.warehouse.write("dpo_dataset", pairs)
    body = client.get("/api/preferences/dataset", params={"limit": 1}).json()
    assert body["n_pairs"] == 2 and [list(p) for p in body["pairs"]] == [PAIR_COLUMNS]
    assert body["pairs"][0]["pair_id"] == "pair_id-2" and body["pairs"][0]["prompt"] == []


def test_training_status_and_train_refuse_with_reasons(client):
    status = client.get("/api/preferences/training_status").json()
    assert status["ready_to_train"] is False and status["blocking_reasons"] and status["cooldown_remaining_s"] == 0
    dry = client.post("/api/preferences/train", params={"dry_run": "true"}, headers=AUTH)
    assert dry.status_code == 200 and dry.json()["launched"] is False
    real = client.post("/api/preferences/train", params={"dry_run": "false"}, headers=AUTH)
    assert real.status_code == 409 and real.json()["detail"]["blocking_reasons"] == status["blocking_reasons"]


def test_launching_without_a_dagster_instance_is_a_503(world, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    client = test_client(make_state(world))
    response = client.post("/api/preferences/extract", headers=AUTH)
    assert response.status_code == 503 and "DAGSTER_HOME" in response.json()["detail"]


def test_rl_status_and_history_on_an_empty_warehouse(client):
    status = client.get("/api/rl/status").json()
    assert status["daily_rl"]["latest_checkpoint"] is None and status["feedback"]["feedback"] == 0
    assert status["preferences"]["ready_to_train"] is False
    assert client.get("/api/rl/history").json() == {"daily_rl": [], "preferences": []}


def test_style_score_keeps_its_model_and_reloads_when_latest_moves(client, world):
    body = {
        "candidate": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]},
        "prompt": {"regime": "risk-on"},
    }
    none = client.post("/api/preferences/style_score", json=body, headers=AUTH).json()
    assert none["available"] is False and none["style_match_score"] is None
    publish_adapter(world, "run-a", seed=1)
    first = client.post("/api/preferences/style_score", json=body, headers=AUTH).json()
    again = client.post("/api/preferences/style_score", json=body, headers=AUTH).json()
    assert first["available"] and first["adapter_loads"] == again["adapter_loads"] == 1
    assert again["style_match_score"] == first["style_match_score"] and 0.0 < first["style_match_score"] < 1.0
    publish_adapter(world, "run-b", seed=2)
    moved = client.post("/api/preferences/style_score", json=body, headers=AUTH).json()
    assert moved["adapter_loads"] == 2 and moved["adapter_path"].endswith("run-b")
    assert moved["margin_logp"] != first["margin_logp"]
    verbatim = client.post(
        "/api/preferences/style_score",
        json={**body, "prompt": "Rebalance review.\nWrite the plan to execute."},
        headers=AUTH,
    )
    assert verbatim.status_code == 200 and verbatim.json()["adapter_loads"] == 2
    for bad in (
        {"candidate": {"orders": []}},
        {"candidate": {"orders": [{"symbol": "MSFT", "side": "hold", "weight": 0.02}]}},
        {"prompt": {}},
    ):
        assert client.post("/api/preferences/style_score", json=bad, headers=AUTH).status_code == 422


def test_the_log_holds_what_was_acknowledged(client):
    ids = {
        client.post("/api/feedback", json={**GOOD, "rollout_index": i % 3}, headers=AUTH).json()["feedback_id"]
        for i in range(6)
    }
    parsed = read_feedback_log(client.app.state.service.feedback_log.file)
    assert {f.feedback_id for f in parsed.feedback} == ids and not parsed.quarantine


def test_a_missing_configured_file_is_a_503_naming_it(world):
    state = make_state(world)
    state.audit_log.path = str(world / "nowhere.jsonl")
    client = test_client(state)
    for response in (client.get("/api/preferences/stats"), client.post("/api/preferences/extract", headers=AUTH)):
        assert response.status_code == 503 and "nowhere.jsonl" in response.json()["detail"]


def _deep(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("ts", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1900-01-01T00:00:00Z"])
def test_a_decision_whose_time_does_not_convert_is_a_422_and_the_loop_goes_on(client, ts):
    """Validated fully before anything is written: the log stays empty and stats, extract's plan and
    the asset's frame still read it."""
    live = client.app.state.service.audit_log.live_file
    response = client.post("/api/decisions", json={**DECISION, "ts": ts}, headers=AUTH)
    assert response.status_code == 422 and "ts" in response.text, response.text
    assert not live.exists() or live.read_text() == ""
    assert client.get("/api/preferences/stats").status_code == 200
    assert client.post("/api/decisions", json=DECISION, headers=AUTH).status_code == 201


@pytest.mark.parametrize("depth", [40, 900, 5000])
def test_deeply_nested_json_is_a_4xx_not_a_500(client, depth):
    live = client.app.state.service.audit_log.live_file
    body = json.dumps({k: v for k, v in DECISION.items() if k != "context"})[:-1] + ', "context": ' + _deep(depth) + "}"
    response = client.post(
        "/api/decisions", content=body.encode(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
    assert not live.exists()
    score = client.post(
        "/api/preferences/style_score",
        headers={**AUTH, "Content-Type": "application/json"},
        content=(
            '{"candidate": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}]}, "prompt": '
            + _deep(depth)
            + "}"
        ).encode(),
    )
    assert 400 <= score.status_code < 500, (score.status_code, score.text[:200])


def test_style_score_caps_orders_and_prompt_size(client):
    order = {"symbol": "MSFT", "side": "buy", "weight": 0.01}
    many = client.post("/api/preferences/style_score", json={"candidate": {"orders": [order] * 26}}, headers=AUTH)
    assert many.status_code == 422 and "at most 25" in many.text
    long_prompt = client.post(
        "/api/preferences/style_score", json={"candidate": {"orders": [order]}, "prompt": "x" * 5000}, headers=AUTH
    )
    assert long_prompt.status_code == 422 and "at most 4096" in long_prompt.text
    assert client.app.state.service.scorer.loads == 0  # refused before any model work


@pytest.mark.parametrize("host", ["evil.example", "rebound.attacker.test:8765"])
def test_a_request_for_another_host_is_refused(client, host):
    response = client.get("/api/rl/status", headers={"Host": host})
    assert response.status_code == 400
    assert client.post("/api/decisions", json=DECISION, headers={**AUTH, "Host": host}).status_code == 400
    assert not client.app.state.service.audit_log.live_file.exists()
    assert client.get("/api/rl/status", headers={"Host": "localhost:8765"}).status_code == 200


def test_allowed_hosts_follow_the_configured_host():
    from service.config import ServiceConfig

    assert ServiceConfig(host="127.0.0.1", token="t" * 20).allowed_hosts == ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert ServiceConfig(host="flywheel.lan", token="t" * 20).allowed_hosts[0] == "flywheel.lan"
    assert ServiceConfig(host="0.0.0.0", token="t" * 20).allowed_hosts == ["*"]


def test_the_dagster_url_must_be_a_webserver_url(monkeypatch):
    from service.config import ServiceConfig

    monkeypatch.setenv("FLYWHEEL_DAGSTER_URL", "http://127.0.0.1:3000/")
    assert ServiceConfig.from_env().dagster_url == "http://127.0.0.1:3000"
    monkeypatch.delenv("FLYWHEEL_DAGSTER_URL")
    assert ServiceConfig.from_env().dagster_url == ""  # unset: the service's own worker
    for bad in (
        "127.0.0.1:3000",
        "file:///tmp/x",
        "http://:3000",
        "http://127.0.0.1:99999",
        "http://u:p@host:3000",
        "http://h/?q=1",
    ):
        monkeypatch.setenv("FLYWHEEL_DAGSTER_URL", bad)
        with pytest.raises(ValueError, match="FLYWHEEL_DAGSTER_URL"):
            ServiceConfig.from_env()


LONE = "\ud800 hi"  # a lone UTF-16 surrogate: valid JSON (as the escape \ud800), not Unicode text
SCORE = {"candidate": {"orders": [{"symbol": "MSFT", "side": "buy", "weight": 0.02}], "text": LONE}}
SURROGATE_BODIES = [
    ("/api/feedback", {**GOOD, "correction": LONE}, ["body", "correction"]),
    ("/api/decisions", {**DECISION, "proposal": {**DECISION["proposal"], "text": LONE}}, ["body", "proposal", "text"]),
    (
        "/api/decisions",
        {**DECISION, "context": {"regime": "risk-on", "notes": [1, {"why": LONE}]}},
        ["body", "context", "notes", 1, "why"],
    ),
    ("/api/decisions", {**DECISION, "context": {LONE: 1}}, ["body", "context"]),  # a key: the path to its object
    ("/api/preferences/style_score", SCORE, ["body", "candidate", "text"]),
    (
        "/api/preferences/style_score",
        {**SCORE, "candidate": {**SCORE["candidate"], "text": None}, "prompt": LONE},
        ["body", "prompt"],
    ),
]


def _wire(body: dict, raw: bool) -> bytes:
    """The body as a client sends it: JSON's ASCII escape (`json.dumps`), or the surrogate's own three
    bytes (ED A0 80), which Python's `json.loads` on bytes also passes through (surrogatepass)."""
    data = json.dumps(body).encode()
    assert b"\\ud800" in data
    return data.replace(b"\\ud800", b"\xed\xa0\x80") if raw else data


@pytest.mark.parametrize("raw", [False, True], ids=["escaped", "raw-bytes"])
@pytest.mark.parametrize(
    "path,body,loc", SURROGATE_BODIES, ids=lambda v: ".".join(map(str, v)) if isinstance(v, list) else None
)
def test_a_lone_surrogate_in_any_text_is_a_422_naming_the_field_and_writes_nothing(world, path, body, loc, raw):
    """`"\\ud800 hi"` reaches the server as a lone surrogate (a 500 from the encoder or the tokenizer
    before): refused with the field and the reason, nothing written, no model work; anonymous, a 401."""
    if "style_score" in path:
        publish_adapter(world, "run-a", seed=1)  # an adapter in place: the score would run the tokenizer
    client = test_client(make_state(world))
    client.raise_server_exceptions = False  # a 500 is an answer to assert on, not an exception here
    state = client.app.state.service
    headers = {"Content-Type": "application/json"}
    anonymous = client.post(path, content=_wire(body, raw), headers=headers)
    assert anonymous.status_code == 401
    response = client.post(path, content=_wire(body, raw), headers={**AUTH, **headers})
    assert response.status_code == 422, response.text[:300]
    [error] = response.json()["detail"]
    assert error["loc"] == loc and error["type"] == "string_unicode"
    assert (
        "lone UTF-16 surrogate" in error["msg"] and "U+D800" in error["msg"] and " hi" not in error["msg"]
    )  # the reason, not the input
    assert not state.feedback_log.file.exists() and not state.audit_log.live_file.exists()
    assert state.scorer.loads == 0
    if not raw:  # the same body with a whole character (a surrogate pair) goes through: only non-text is refused
        fixed = json.loads(json.dumps(body).replace("\\ud800", "\\ud83d\\ude00"))
        done = client.post(path, json=fixed, headers=AUTH)
        assert done.status_code in (200, 201), done.text[:300]

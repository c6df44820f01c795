"""The review pages: rendered on the small world, markup in notes and corrections shown as text,
form posts only from a signed-in browser with the page's CSRF field, and each refused post says why."""

from __future__ import annotations

import html
import re

from fastapi.testclient import TestClient
from markupsafe import escape

from service.security import SESSION_COOKIE
from tests.service_fixtures import AUTH, DAY, HEADLINES, MARKUP_NOTE, TOKEN, publish_adapter

SCRIPT = '<script>alert("pwned")</script> Buy NVDA, 2%.'


def signed_in(client: TestClient) -> str:
    """Sign in by posting the token (the login form); returns the CSRF field the pages then carry."""
    response = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303 and SESSION_COOKIE in response.headers["set-cookie"]
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "max-age=43200" in cookie
    assert "secure" not in cookie  # on loopback, plain HTTP
    page = client.get("/").text
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)


def test_pages_render_and_show_notes_as_text(client):
    page = client.get("/")
    assert page.status_code == 200 and f"Notes of {DAY}" in page.text
    assert "<img src=x" not in page.text and html.escape(MARKUP_NOTE, quote=False).splitlines()[1] in page.text
    assert "feedback-form" not in page.text  # no forms before signing in
    for path in ("/curation", "/status", "/proposal", "/login"):
        assert client.get(path).status_code == 200, path


def test_a_script_in_a_correction_renders_as_text(client):
    made = client.post(
        "/api/feedback",
        json={"date": DAY, "headline_id": HEADLINES[0], "rollout_index": 0, "correction": SCRIPT, "reviewer": "ana"},
        headers=AUTH,
    )
    assert made.status_code == 201
    page = client.get("/curation").text
    assert SCRIPT not in page and "<script>" not in page
    assert str(escape(SCRIPT)) in page  # &lt;script&gt;alert(&#34;pwned&#34;)... : shown, never run


def test_form_posts_need_the_session_and_the_csrf_field(client, world):
    form = {
        "date": DAY,
        "headline_id": HEADLINES[1],
        "rollout_index": "2",
        "thumbs": "down",
        "stars": "2",
        "reviewer": "ana",
    }
    log = client.app.state.service.feedback_log.file
    assert client.post("/feedback", data=form, follow_redirects=False).status_code == 401
    csrf = signed_in(client)
    assert client.post("/feedback", data={**form, "csrf": "0" * 64}, follow_redirects=False).status_code == 403
    assert not log.exists()
    done = client.post("/feedback", data={**form, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and "flash=" in done.headers["location"]
    assert len(log.read_text().splitlines()) == 1
    refused = client.post("/feedback", data={**form, "stars": "9", "csrf": csrf}, follow_redirects=False)
    assert (
        refused.status_code == 303
        and "error=" in refused.headers["location"]
        and "stars" in refused.headers["location"]
    )
    assert len(log.read_text().splitlines()) == 1
    # The page shows people's rating on the note now.
    assert "people: 12%" in client.get("/").text  # thumbs down (0) and 2 stars (0.25): mean 0.125


def test_curator_verifies_on_the_page(client):
    made = client.post(
        "/api/feedback",
        json={
            "date": DAY,
            "headline_id": HEADLINES[0],
            "rollout_index": 1,
            "correction": "Sell NVDA.",
            "reviewer": "ana",
        },
        headers=AUTH,
    ).json()
    csrf = signed_in(client)
    page = client.get("/curation").text
    assert f'id="fb-{made["feedback_id"]}"' in page
    edit_without_text = client.post(
        f"/curation/{made['feedback_id']}",
        data={"action": "edit", "curator": "cu", "csrf": csrf},
        follow_redirects=False,
    )
    assert "error=" in edit_without_text.headers["location"]
    approved = client.post(
        f"/curation/{made['feedback_id']}", data={"action": "approve", "curator": "cu", "csrf": csrf}
    )
    assert approved.status_code == 200 and "Verdict" in approved.text and 'id="queue-empty"' in approved.text


def test_sign_in_refuses_a_wrong_token_and_never_redirects_off_site(client):
    assert client.post("/login", data={"token": "nope"}).status_code == 401
    off_site = client.post("/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False)
    assert off_site.headers["location"] == "/"


def test_proposal_page_shows_the_style_panel(client, world):
    csrf = signed_in(client)
    no_adapter = client.post("/proposal", data={"orders": "buy MSFT 2%", "csrf": csrf}).text
    assert 'class="panel band-none"' in no_adapter and "No preference adapter yet" in no_adapter
    publish_adapter(world, "run-a", seed=1)
    page = client.post(
        "/proposal", data={"orders": "buy MSFT 2%\nsell XOM 0.03", "context": '{"regime": "risk-on"}', "csrf": csrf}
    ).text
    score = re.search(r'id="style-score">(\d+)%<', page)
    assert score and re.search(r'class="panel band-(consistent|leans-towards|leans-away|inconsistent)"', page)
    assert "learning signal: no holdout evaluation yet" in page
    assert "Buy MSFT (Information Technology), 2.0% of the portfolio." in page
    bad = client.post("/proposal", data={"orders": "purchase MSFT lots", "csrf": csrf})
    assert bad.status_code == 422 and "is not like" in bad.text


def test_deciding_on_the_page_writes_the_live_log(client):
    csrf = signed_in(client)
    done = client.post(
        "/proposal/decide",
        data={
            "orders": "buy MSFT 2%",
            "decision": "override",
            "operator_orders": "buy MSFT 1%",
            "reason": "smaller",
            "csrf": csrf,
        },
        follow_redirects=False,
    )
    assert done.status_code == 303 and "flash=" in done.headers["location"]
    record = client.app.state.service.audit_log.parse().records[-1][1]
    assert record.decision == "override" and record.operator_orders[0].weight == 0.01
    refused = client.post(
        "/proposal/decide", data={"orders": "buy MSFT 2%", "decision": "override", "csrf": csrf}, follow_redirects=False
    )
    assert "error=" in refused.headers["location"] and "override" in refused.headers["location"]


def test_a_token_in_the_address_signs_nobody_in(client):
    """`/login?token=` would leave the token in the browser's history and the access log."""
    response = client.get("/login", params={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 400 and SESSION_COOKIE not in response.headers.get("set-cookie", "")
    assert TOKEN not in response.text and "paste it below" in response.text
    assert 'method="post" action="/login"' in client.get("/login").text


def test_the_access_log_never_holds_a_token():
    import logging

    from service.config import ServiceConfig
    from service.main import RedactTokens, banner

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/login?next=/&token={TOKEN}&x=1", "1.1", 400),
        None,
    )
    assert (
        RedactTokens().filter(record)
        and TOKEN not in record.getMessage()
        and "token=<hidden>&x=1" in record.getMessage()
    )
    made = ServiceConfig(token="")
    assert "/login?token" not in banner(made) and made.token in banner(made)  # printed once, never in a link


def test_anonymous_visitors_cannot_make_the_model_work(client, world):
    publish_adapter(world, "run-a", seed=1)
    page = client.get("/proposal", params={"orders": "buy MSFT 2%\n" * 600})
    assert page.status_code == 200 and 'id="style-panel"' not in page.text and 'id="sign-in-to-score"' in page.text
    assert client.post("/proposal", data={"orders": "buy MSFT 2%"}, follow_redirects=False).status_code == 401
    assert client.app.state.service.scorer.loads == 0
    csrf = signed_in(client)
    assert client.post("/proposal", data={"orders": "buy MSFT 2%", "csrf": "0" * 64}).status_code == 403
    too_many = client.post("/proposal", data={"orders": "buy MSFT 1%\n" * 26, "csrf": csrf})
    assert too_many.status_code == 422 and "at most 25" in too_many.text
    deep = client.post(
        "/proposal", data={"orders": "buy MSFT 1%", "context": '{"a": ' + "[" * 3000 + "]" * 3000 + "}", "csrf": csrf}
    )
    assert deep.status_code == 422 and "too deeply" in deep.text
    nested = client.post(
        "/proposal", data={"orders": "buy MSFT 1%", "context": '{"a": ' + "[" * 40 + "]" * 40 + "}", "csrf": csrf}
    )
    assert nested.status_code == 422 and "more than 32 deep" in nested.text
    assert client.app.state.service.scorer.loads == 0


def test_sessions_are_signed_expire_and_csrf_belongs_to_the_session(client):
    from service.security import new_session, valid_session

    config = client.app.state.service.config
    now = 1_750_000_000
    session = new_session(config, now)
    assert valid_session(config, session, now + 60) and not valid_session(
        config, session, now + config.session_ttl_s + 1
    )
    issued, nonce, signature = session.split(".")
    assert not valid_session(
        config, f"{int(issued) + 3600}.{nonce}.{signature}", now
    )  # a moved issue time breaks the signature
    assert not valid_session(config, config.derived("session"), now)  # the old fixed value
    old = new_session(config, now=0)
    client.cookies.set(SESSION_COOKIE, old)
    assert client.post("/feedback", data={"csrf": "x"}, follow_redirects=False).status_code == 401
    assert "sign in to write" in client.get("/").text
    client.cookies.clear()
    csrf_one = signed_in(client)
    client.cookies.clear()
    csrf_two = signed_in(client)
    assert csrf_one != csrf_two  # per session, not one fixed value


def test_a_session_cookie_is_secure_off_loopback(world):
    from tests.service_fixtures import make_state, test_client

    state = make_state(world)
    state.config.host = "flywheel.lan"
    client = test_client(state)
    response = client.post("/login", data={"token": TOKEN}, headers={"Host": "flywheel.lan"}, follow_redirects=False)
    assert response.status_code == 303 and "secure" in response.headers["set-cookie"].lower()


def test_the_message_box_shows_only_the_services_own_words(client):
    forged = client.get("/", params={"error": "Your session expired: paste your token at https://evil.example"})
    assert "evil.example" not in forged.text and 'id="error"' not in forged.text
    csrf = signed_in(client)
    refused = client.post(
        "/feedback",
        data={
            "date": DAY,
            "headline_id": HEADLINES[1],
            "rollout_index": "2",
            "stars": "9",
            "reviewer": "ana",
            "csrf": csrf,
        },
        follow_redirects=False,
    )
    shown = client.get(refused.headers["location"])
    assert 'id="error"' in shown.text and "stars" in shown.text


def test_a_lone_surrogate_typed_into_the_context_is_refused_with_the_reason(client, world):
    """The context box takes JSON, where `\\ud800` is a valid escape of a lone surrogate (not text): the
    score and the decision forms say so and neither runs the model nor writes the live log."""
    publish_adapter(world, "run-a", seed=1)
    csrf = signed_in(client)
    context = '{"regime": "\\ud800 hi"}'
    scored = client.post("/proposal", data={"orders": "buy MSFT 2%", "context": context, "csrf": csrf})
    assert scored.status_code == 422 and "lone UTF-16 surrogate" in html.unescape(scored.text)
    assert "the context['regime']" in html.unescape(scored.text)
    decided = client.post(
        "/proposal/decide",
        data={"orders": "buy MSFT 2%", "decision": "approve", "context": context, "csrf": csrf},
        follow_redirects=False,
    )
    assert (
        decided.status_code == 303
        and "error=" in decided.headers["location"]
        and "surrogate" in decided.headers["location"]
    )
    assert client.app.state.service.scorer.loads == 0 and not client.app.state.service.audit_log.live_file.exists()

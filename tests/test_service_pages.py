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
    """Sign in through the printed link; returns the CSRF field the pages then carry."""
    response = client.get("/login", params={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303 and SESSION_COOKIE in response.headers["set-cookie"]
    assert "httponly" in response.headers["set-cookie"].lower() and "samesite=strict" in response.headers["set-cookie"].lower()
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
    made = client.post("/api/feedback", json={"date": DAY, "headline_id": HEADLINES[0], "rollout_index": 0, "correction": SCRIPT,
                                              "reviewer": "ana"}, headers=AUTH)
    assert made.status_code == 201
    page = client.get("/curation").text
    assert SCRIPT not in page and "<script>" not in page
    assert str(escape(SCRIPT)) in page  # &lt;script&gt;alert(&#34;pwned&#34;)... : shown, never run


def test_form_posts_need_the_session_and_the_csrf_field(client, world):
    form = {"date": DAY, "headline_id": HEADLINES[1], "rollout_index": "2", "thumbs": "down", "stars": "2", "reviewer": "ana"}
    log = client.app.state.service.feedback_log.file
    assert client.post("/feedback", data=form, follow_redirects=False).status_code == 401
    csrf = signed_in(client)
    assert client.post("/feedback", data={**form, "csrf": "0" * 64}, follow_redirects=False).status_code == 403
    assert not log.exists()
    done = client.post("/feedback", data={**form, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and "flash=" in done.headers["location"]
    assert len(log.read_text().splitlines()) == 1
    refused = client.post("/feedback", data={**form, "stars": "9", "csrf": csrf}, follow_redirects=False)
    assert refused.status_code == 303 and "error=" in refused.headers["location"] and "stars" in refused.headers["location"]
    assert len(log.read_text().splitlines()) == 1
    # The page shows people's rating on the note now.
    assert "people: 12%" in client.get("/").text  # thumbs down (0) and 2 stars (0.25): mean 0.125


def test_curator_verifies_on_the_page(client):
    made = client.post("/api/feedback", json={"date": DAY, "headline_id": HEADLINES[0], "rollout_index": 1, "correction": "Sell NVDA.",
                                              "reviewer": "ana"}, headers=AUTH).json()
    csrf = signed_in(client)
    page = client.get("/curation").text
    assert f'id="fb-{made["feedback_id"]}"' in page
    edit_without_text = client.post(f"/curation/{made['feedback_id']}", data={"action": "edit", "curator": "cu", "csrf": csrf}, follow_redirects=False)
    assert "error=" in edit_without_text.headers["location"]
    approved = client.post(f"/curation/{made['feedback_id']}", data={"action": "approve", "curator": "cu", "csrf": csrf})
    assert approved.status_code == 200 and "Verdict" in approved.text and 'id="queue-empty"' in approved.text


def test_sign_in_refuses_a_wrong_token_and_never_redirects_off_site(client):
    assert client.get("/login", params={"token": "nope"}).status_code == 401
    assert client.post("/login", data={"token": "nope"}).status_code == 401
    off_site = client.post("/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False)
    assert off_site.headers["location"] == "/"


def test_proposal_page_shows_the_style_panel(client, world):
    no_adapter = client.get("/proposal", params={"orders": "buy MSFT 2%"}).text
    assert 'class="panel band-none"' in no_adapter and "No preference adapter yet" in no_adapter
    publish_adapter(world, "run-a", seed=1)
    page = client.get("/proposal", params={"orders": "buy MSFT 2%\nsell XOM 0.03", "context": '{"regime": "risk-on"}'}).text
    score = re.search(r'id="style-score">(\d+)%<', page)
    assert score and re.search(r'class="panel band-(consistent|leans-towards|leans-away|inconsistent)"', page)
    assert "learning signal: no holdout evaluation yet" in page
    assert "Buy MSFT (Information Technology), 2.0% of the portfolio." in page
    bad = client.get("/proposal", params={"orders": "purchase MSFT lots"})
    assert bad.status_code == 422 and "is not like" in bad.text


def test_deciding_on_the_page_writes_the_live_log(client):
    csrf = signed_in(client)
    done = client.post("/proposal/decide", data={"orders": "buy MSFT 2%", "decision": "override", "operator_orders": "buy MSFT 1%",
                                                 "reason": "smaller", "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and "flash=" in done.headers["location"]
    record = client.app.state.service.audit_log.parse().records[-1][1]
    assert record.decision == "override" and record.operator_orders[0].weight == 0.01
    refused = client.post("/proposal/decide", data={"orders": "buy MSFT 2%", "decision": "override", "csrf": csrf}, follow_redirects=False)
    assert "error=" in refused.headers["location"] and "override" in refused.headers["location"]

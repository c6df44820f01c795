"""Is a headline good or bad news for its company? One definition, for the synthetic worlds
(`prices.py`) and for measuring tiny-local's sides on good vs bad news.

The bundled archive's events are fictional and written from the tiny-local corpus's templates
(`scripts/make_tiny_local_corpus.py`, POSITIVE and NEGATIVE), so the news a headline carries is the
template it was written from, read back by its wording:

  good (+1): "... beats ... estimates", "... share buyback", "... raises ... guidance",
             "Regulators clear ...", "... wins ... contract"
  bad  (-1): "... misses ... estimates", "... cuts outlook", "... antitrust probe", "... recalls ...",
             "... steps down"
  none  (0): anything else, and a text that reads both ways.

The title decides; when it carries no event, the summary does. That is how a follow-up counts: its
title states a real past move ("AAPL shares rise 1.3% after the news", which is not news of its own)
and its summary names the event it follows up on ("Follow-up: Apple beats quarterly estimates ..."),
so a follow-up is the same news again.
"""

from __future__ import annotations

import re

GOOD_NEWS = re.compile(
    r"\bbeats\b.*\bestimates\b|\bshare\s+buyback\b|\braises\b.*\bguidance\b|\bregulators\s+clear\b|\bwins\b.*\bcontract\b",
    re.IGNORECASE,
)
BAD_NEWS = re.compile(
    r"\bmisses\b.*\bestimates\b|\bcuts\s+outlook\b|\bantitrust\s+probe\b|\brecalls\b|\bsteps\s+down\b", re.IGNORECASE
)


def _direction(text: object) -> int:
    if not isinstance(text, str) or not text.strip():
        return 0
    good, bad = bool(GOOD_NEWS.search(text)), bool(BAD_NEWS.search(text))
    return int(good) - int(bad)  # both: 0 (reads both ways)


def news_direction(title: object, summary: object = None) -> int:
    """+1 good news, -1 bad news, 0 neither (or both): the title's event, else the summary's."""
    return _direction(title) or _direction(summary)

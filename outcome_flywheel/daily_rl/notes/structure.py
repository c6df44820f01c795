"""Structure score of a trading note: the fraction of the six required sections it carries.

A section counts when its name starts a line as a header (`Stop Loss: 5% below entry`, also
markdown forms such as `**Stop Loss:**`, `## Stop Loss`, `1. Stop Loss -`) and the section has
some text: on the header's line or on the lines below it before the next header. Each section
counts once, whatever the order.
"""

from __future__ import annotations

import re

from outcome_flywheel.models.prompts import NOTE_SECTIONS

# Leading list / emphasis / heading marks a writer may put before a header.
_LEAD = r"^[ \t>*_#\-•\d.)]*"


def _header_pattern(name: str) -> re.Pattern:
    words = r"\s+".join(re.escape(w) for w in name.split())
    # header, optional closing emphasis, then ':' / '-' / '–' with text, or the end of the line
    return re.compile(_LEAD + words + r"[ \t*_]*(?:[:\-–—][ \t*_]*(?P<rest>.*)|$)", re.IGNORECASE)


_PATTERNS = {name: _header_pattern(name) for name in NOTE_SECTIONS}


def sections_present(text: str, sections: tuple[str, ...] = NOTE_SECTIONS) -> list[str]:
    """The required sections found in `text`, in the canonical order."""
    lines = (text or "").splitlines()
    headers: dict[int, str] = {}  # line index -> section name
    rests: dict[int, str] = {}
    for i, line in enumerate(lines):
        for name in sections:
            m = _PATTERNS[name].match(line) if name in _PATTERNS else _header_pattern(name).match(line)
            if m:
                headers.setdefault(i, name)
                rests.setdefault(i, (m.group("rest") or "").strip(" \t*_"))
                break
    found: set[str] = set()
    for i, name in headers.items():
        if rests[i]:
            found.add(name)
            continue
        # header alone on its line: its text is on the following lines, up to the next header
        for j in range(i + 1, len(lines)):
            if j in headers:
                break
            if lines[j].strip():
                found.add(name)
                break
    return [name for name in sections if name in found]


def structure_score(text: str, sections: tuple[str, ...] = NOTE_SECTIONS) -> float:
    """Fraction of the required sections present, in [0, 1]."""
    return len(sections_present(text, sections)) / len(sections)

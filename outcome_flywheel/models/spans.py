"""Which response tokens a character span of the response's text covers: how a reward signal that
judges one part of a note (the trade call's line) reaches only that part's tokens.

A response's text is `tokenizer.decode(ids, skip_special_tokens=True)`. The fast tokenizer's offsets
(`return_offsets_mapping=True`) of that text give each token's characters when re-encoding the text
gives back the sampled ids (the usual case); a sampled tokenisation the encoder would not choose, or
text that does not round-trip, falls back to decoding growing prefixes (a token's characters end where
the prefix that ends with it ends). Special tokens (end of turn) have no characters and are in no span.
"""

from __future__ import annotations

from typing import Any, Sequence


def token_char_ends(tokenizer: Any, token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) characters of each token in the decoded text; (end, end) for tokens with none."""
    ids = [int(t) for t in token_ids]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    text = tokenizer.decode(ids, skip_special_tokens=True)
    plain = [t for t in ids if t not in special]
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(o) for o in encoded["offset_mapping"]]
        same = list(encoded["input_ids"]) == plain
    except (NotImplementedError, KeyError, TypeError):  # a slow tokenizer has no offsets
        offsets, same = [], False
    out: list[tuple[int, int]] = []
    if same:
        it = iter(offsets)
        last = 0
        for t in ids:
            if t in special:
                out.append((last, last))
            else:
                start, end = next(it)
                out.append((int(start), int(end)))
                last = int(end)
        return out
    prefix: list[int] = []
    last = 0
    for t in ids:
        if t in special:
            out.append((last, last))
            continue
        prefix.append(t)
        end = max(last, len(tokenizer.decode(prefix, skip_special_tokens=True)))  # a partial UTF-8 byte: "?" for now
        out.append((last, end))
        last = end
    return out


def span_token_mask(tokenizer: Any, token_ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """True for each token whose characters overlap one of `spans` (character [start, end) ranges of
    the decoded response text)."""
    return chars_in_spans(token_char_ends(tokenizer, token_ids), spans)


def chars_in_spans(chars: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """`span_token_mask` from the tokens' characters (`token_char_ends`), for a caller that needs them too."""
    return [any(start < b and a < end for a, b in spans) if end > start else False for start, end in chars]

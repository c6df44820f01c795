"""The judge's side of the daily loop, without a model: letter extraction, rank repair, and the
iterative best-of-remaining selection (docs/daily_rl.md, "The judge": letters A-H, temperature
0.3, a greedy retry asking for exactly one letter, final ranks always a permutation of 1..N).

The model is reached through a callable `ask(requests, strict) -> answers`, one raw answer (or
None) per request, so the selection is tested with scripted answers. A request names the group
and the candidates still in play in the order they are shown, relabelled A, B, ...; that order
is a fresh seeded permutation every round (recorded), so a judge that favours a position spreads
its bias over the rollouts at random instead of handing it to rollout index 0.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from outcome_flywheel.daily_rl.judge.prompt_budget import NoteCut, cut_notes, prompt_budget
from outcome_flywheel.daily_rl.partitions import stable_seed
from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import JUDGE_LETTERS, judge_messages

if TYPE_CHECKING:
    from outcome_flywheel.models.interface import ModelBackend


_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\s*(.*?)\s*```", re.DOTALL)


_JSON_KEYS = ("answer", "choice", "letter", "best", "pick", "selection", "option", "candidate", "winner")


# in order of trust: the whole answer is one letter (maybe repeated, bracketed or punctuated);
# "answer: c" / "best is [C]"; a bracketed letter anywhere; a standalone capital letter.
_PATTERNS = (
    re.compile(r"^\W*([A-Za-z])(?:\W*\1)*\W*$"),
    # a lower-case letter counts only when no word follows it ("the answer is a tough one" names no A)
    re.compile(
        r"\b(?i:answer|choice|letter|best|pick|option|candidate|winner)\b\W{0,4}(?:(?i:is|was)\W{0,4})?([A-Z]|[a-z](?!\s+[A-Za-z]))\b"
    ),
    re.compile(r"[\[(<{]\s*([A-Za-z])\s*[\])>}]"),
    # "A strong note: D", "the best one is D": a capital letter after a colon, '=' or is/was
    re.compile(r"(?:[:=]|\b(?:is|was)\b)\s*\**\s*([A-Z])\b(?![\w'])"),
    # a standalone capital that does not open a phrase ("A strong note", "I think" are words)
    re.compile(r"\b([A-Z])\b(?!\s+[a-z])(?![\w'])"),
    re.compile(r"\b([A-Z])\b(?![\w'])"),
)


def answer_after_thinking(text: str | None) -> str | None:
    """What a reasoning judge answered: the text after its last `</think>`. A think block that never
    closed (cut off by the token limit) holds no answer: "" (the retry asks again)."""
    if not text:
        return text
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return "" if "<think>" in text else text


def extract_letter(text: str | None, n_options: int, letters: str = JUDGE_LETTERS) -> int | None:
    """Index of the option the answer names (0 = A), or None when it names none in range. A
    reasoning judge's answer is read after `</think>` (`answer_after_thinking`).

    Tolerates JSON (`{"answer": "C"}`), code fences, brackets, lower case, repeats and chatter
    around the letter; a letter beyond the options shown (e.g. "F" of five) counts as no answer.
    """
    text = answer_after_thinking(text)
    if not text or n_options < 1:
        return None
    valid = letters[:n_options].upper()
    body = text.strip()
    fence = _FENCE.search(body)
    if fence:
        body = fence.group(1).strip()
    body = body.strip("`").strip()
    try:
        parsed = json.loads(body)
    except (ValueError, TypeError):
        parsed = None
    if isinstance(parsed, dict):
        lowered = {str(k).lower(): v for k, v in parsed.items()}
        values = [lowered[k] for k in _JSON_KEYS if k in lowered] or list(parsed.values())
        body = " ".join(str(v) for v in values if isinstance(v, (str, int, float)))
    elif isinstance(parsed, list) and parsed:
        body = str(parsed[0])
    elif isinstance(parsed, str):
        body = parsed
    for pattern in _PATTERNS:
        for match in pattern.finditer(body):
            letter = match.group(1).upper()
            if letter in valid:
                return valid.index(letter)
        # a strong pattern that named a letter out of range is a wrong answer, not chatter
        if pattern is _PATTERNS[0] and pattern.match(body):
            return None
    return None


def picks_to_ranks(picks: Sequence[int | None], n: int) -> list[int]:
    """Ranks (1 = best) of candidates 0..n-1 from the order they were picked in.

    Repeats and out-of-range picks are dropped; candidates never picked follow in index order,
    so the result is always a permutation of 1..n (their reward must not follow that order:
    `rank_rewards` gives them all the same one).
    """
    order: list[int] = []
    for p in picks:
        if isinstance(p, int) and 0 <= p < n and p not in order:
            order.append(p)
    order += [i for i in range(n) if i not in order]
    ranks = [0] * n
    for position, candidate in enumerate(order):
        ranks[candidate] = position + 1
    return ranks


def repair_ranks(ranks: Sequence[float | int | None], n: int | None = None) -> list[int]:
    """Any rank vector (duplicates, out of range, missing) made a permutation of 1..n.

    Values are clamped to [1, n] (missing ones go last), then ties are broken by index.
    """
    n = len(ranks) if n is None else n
    values = list(ranks)[:n] + [None] * max(0, n - len(ranks))
    keyed = []
    for i, v in enumerate(values):
        try:
            v = float(v)
            v = min(max(v, 1.0), float(n)) if v == v else float(n + 1)  # NaN -> last
        except (TypeError, ValueError):
            v = float(n + 1)
        keyed.append((v, i))
    out = [0] * n
    for position, (_, i) in enumerate(sorted(keyed)):
        out[i] = position + 1
    return out


def is_permutation(ranks: Sequence[int]) -> bool:
    return sorted(int(r) for r in ranks) == list(range(1, len(ranks) + 1))


NO_OUTCOME_HEADLINES = "no outcome headlines"


NEVER_ANSWERED = "judge never answered"


@dataclass(frozen=True)
class JudgeRequest:
    group: int
    remaining: tuple[int, ...]  # candidate indices still in play, shown as A, B, ... in this order


@dataclass
class GroupJudgement:
    ranks: list[int]  # rank of candidate i, 1 = best; always a permutation of 1..N
    picks: list[int] = field(default_factory=list)  # candidates the judge placed, best first
    rounds_answered: int = 0
    retries: int = 0  # greedy single-letter retries used
    fallback: bool = False  # the judge failed a round: the rest were never placed
    answers: list[str] = field(default_factory=list)
    shown: list[list[int]] = field(default_factory=list)  # per round, the candidates in the order shown (A, B, ...)
    skipped: str = ""  # why the judge was not asked at all (e.g. no outcome headlines)
    note_tokens: list[int] = field(default_factory=list)  # each note's length in tokens
    shown_tokens: list[int] = field(default_factory=list)  # what the prompt budget let the judge see
    prompt_tokens: int = 0  # the longest prompt this group can be asked with (every note shown, either wording)

    def truncated(self, candidate: int) -> bool:
        return bool(self.note_tokens) and self.shown_tokens[candidate] < self.note_tokens[candidate]

    @property
    def unusable_reason(self) -> str:
        """Why the group is kept for the record but not trained on; "" when usable."""
        if self.skipped:
            return self.skipped
        return NEVER_ANSWERED if self.rounds_answered == 0 else ""

    @property
    def usable(self) -> bool:
        return not self.unusable_reason

    def first_position(self, candidate: int) -> int:
        """Where the candidate was shown in the first round (0 = A), -1 if never shown."""
        return self.shown[0].index(candidate) if self.shown and candidate in self.shown[0] else -1


AskFn = Callable[[list[JudgeRequest], bool], Sequence[str | None]]


def rank_groups(
    group_sizes: Sequence[int], ask: AskFn, letters: str = JUDGE_LETTERS, seeds: Sequence[int] | None = None
) -> list[GroupJudgement]:
    """Iterative best-of-remaining selection over many groups at once.

    Each round asks every unfinished group (one batched `ask(requests, strict=False)`, the
    sampled call) which remaining candidate is best, showing them in a permutation drawn from
    the group's seed and the round (index order when `seeds` is None); groups whose answer names
    no valid letter are asked again, same order, with `strict=True` (the greedy single-letter
    retry). A group whose retry fails too stops there (`fallback`): its unplaced candidates get
    the ranks after the placed ones, in index order, only so that ranks stay a permutation. A
    group's last candidate is placed without asking.
    """
    if any(n > len(letters) for n in group_sizes):
        raise ValueError(f"at most {len(letters)} candidates per group")
    if seeds is not None and len(seeds) != len(group_sizes):
        raise ValueError("one seed per group")
    remaining = {g: list(range(n)) for g, n in enumerate(group_sizes)}
    results = {g: GroupJudgement(ranks=[]) for g in range(len(group_sizes))}
    active = [g for g, n in enumerate(group_sizes) if n > 1]
    round_index = 0
    while active:
        requests = []
        for g in active:
            order = list(remaining[g])
            if seeds is not None:
                random.Random(stable_seed(seeds[g], "presentation", round_index)).shuffle(order)
            results[g].shown.append(order)
            requests.append(JudgeRequest(g, tuple(order)))
        round_index += 1
        answers = list(ask(requests, False))
        picked = {}
        failed = []
        for req, answer in zip(requests, answers):
            results[req.group].answers.append(answer or "")
            idx = extract_letter(answer, len(req.remaining), letters)
            if idx is None:
                failed.append(req)
            else:
                picked[req.group] = req.remaining[idx]
        if failed:
            retry_answers = list(ask(failed, True))
            for req, answer in zip(failed, retry_answers):
                result = results[req.group]
                result.retries += 1
                result.answers.append(answer or "")
                idx = extract_letter(answer, len(req.remaining), letters)
                if idx is None:
                    result.fallback = True
                else:
                    picked[req.group] = req.remaining[idx]
        next_active = []
        for g in active:
            if g not in picked:
                continue  # failed twice: stop asking this group
            result = results[g]
            result.picks.append(picked[g])
            result.rounds_answered += 1
            remaining[g].remove(picked[g])
            if len(remaining[g]) > 1:
                next_active.append(g)
            else:
                result.picks.extend(remaining[g])
        active = next_active
    for g, n in enumerate(group_sizes):
        results[g].ranks = picks_to_ranks(results[g].picks, n)
    return [results[g] for g in range(len(group_sizes))]


_WORD = re.compile(r"[A-Za-z][A-Za-z&'.-]+")


_STOP = {
    "the",
    "and",
    "for",
    "after",
    "with",
    "from",
    "into",
    "over",
    "its",
    "shares",
    "news",
    "day",
    "a",
    "of",
    "on",
    "in",
    "to",
    "as",
}


def select_outcome_headlines(prediction_headline: str, outcome_headlines: Sequence[str], k: int = 3) -> list[str]:
    """The next day's headlines to show the judge: those sharing the most words with the
    prediction's headline first (the follow-ups), then the day's others in order, `k` in all.

    A small judge's context cannot hold a whole day's news; eight candidate notes already fill
    most of it.
    """
    if k <= 0:
        return []
    words = {w.lower().strip(".'") for w in _WORD.findall(prediction_headline)} - _STOP
    scored = []
    for position, headline in enumerate(outcome_headlines):
        overlap = len(words & ({w.lower().strip(".'") for w in _WORD.findall(headline)} - _STOP))
        scored.append((-overlap, position, headline))
    scored.sort()
    return [h for _, _, h in scored[:k]]


@dataclass
class JudgeGroup:
    """One headline's notes and what happened next."""

    prediction_headline: str
    outcome_headlines: list[str]
    candidates: list[str]
    seed: int
    context_heading: str = "What happened next:"  # policy_eval shows the day's own news instead


def judge_groups(
    backend: "ModelBackend",
    groups: Sequence[JudgeGroup],
    temperature: float = 0.3,
    max_new_tokens: int = 8,
    prompt_tokens: int = 4096,
    shuffle: bool = True,
    enable_thinking: bool = False,
) -> list[GroupJudgement]:
    """Rank every group's candidates with `backend` as the judge; batched per round. `shuffle=False`
    shows them in the order given (the caller drew and recorded that order itself).

    Notes are cut to fit `prompt_tokens` (and the model's context) fairly (`prompt_budget.py`), once
    per group; the cut is recorded on each judgement. `enable_thinking`: the sampled answer may
    reason first (Qwen3), `max_new_tokens` must leave it room; the letter is read after `</think>`.
    The greedy retry never thinks: it asks for exactly one letter.

    A group with no outcome headlines to judge against is not asked: the judge would rank the
    notes on nothing, so it is unusable (`skipped`), not a judgement."""
    asked = [g for g, group in enumerate(groups) if group.outcome_headlines]
    round_of: dict[int, int] = {}

    def render(group: JudgeGroup, shown: list[str], strict: bool):
        return judge_messages(
            group.prediction_headline,
            group.outcome_headlines,
            shown,
            context_heading=group.context_heading,
            max_candidate_chars=None,
            strict=strict,
        )

    def prompt_length(group: JudgeGroup, shown: list[str]) -> int:
        # the longer of the two wordings: the sampled ask (thinking as configured) and the greedy
        # retry (never thinking: its prompt closes an empty think block), so both fit the budget
        return max(
            len(backend.prompt_ids(render(group, shown, False), enable_thinking)),
            len(backend.prompt_ids(render(group, shown, True), False)),
        )

    cuts: dict[int, list[NoteCut]] = {}
    longest: dict[int, int] = {}  # round one shows every note: no later prompt is longer
    budget = prompt_budget(prompt_tokens, backend.context_length, max_new_tokens) if asked else 0
    for g in asked:
        group = groups[g]
        overhead = prompt_length(group, [""] * len(group.candidates))
        cuts[g] = cut_notes(group.candidates, budget - overhead, backend.text_ids, backend.decode)
        longest[g] = prompt_length(group, [c.text for c in cuts[g]])

    def messages(req: JudgeRequest, strict: bool):
        g = asked[req.group]
        return render(groups[g], [cuts[g][i].text for i in req.remaining], strict)  # relabelled A.. in this order

    def ask(requests: list[JudgeRequest], strict: bool) -> list[str]:
        prompts = [messages(r, strict) for r in requests]
        if strict:
            return backend.greedy(prompts, max_new_tokens)
        seeds = []
        for r in requests:
            round_of[r.group] = round_of.get(r.group, -1) + 1
            seeds.append(stable_seed(groups[asked[r.group]].seed, "judge-round", round_of[r.group]))
        config = SamplingConfig(
            temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, enable_thinking=enable_thinking
        )
        return [s[0].text for s in backend.sample(prompts, 1, config, seeds)]

    seeds = [groups[g].seed for g in asked] if shuffle else None
    judged = rank_groups([len(groups[g].candidates) for g in asked], ask, seeds=seeds) if asked else []
    out = [
        GroupJudgement(ranks=list(range(1, len(group.candidates) + 1)), skipped=NO_OUTCOME_HEADLINES)
        for group in groups
    ]
    for g, judgement in zip(asked, judged):
        judgement.note_tokens = [c.tokens for c in cuts[g]]
        judgement.shown_tokens = [c.shown_tokens for c in cuts[g]]
        judgement.prompt_tokens = longest[g]
        out[g] = judgement
    return out

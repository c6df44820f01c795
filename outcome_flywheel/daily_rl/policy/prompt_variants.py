"""Variants of the note-writing system prompt and the mutations that make new ones (the prompt evolver's
writers, `prompt_evolver.py`).

A variant is a `PromptSpec`: the role sentence, the rules it spells out and an optional example. The
base spec is the role alone and renders exactly `SYSTEM_PROMPT` (the prompt tiny-local was trained on
and the baseline, gate and A/B keep using). Every mutation keeps the prompt's logic, it only changes how
it is said: spell out the rules the prompt already gives (the six sections, short, actionable, no trade
when there is nothing to trade), reorder the rules, rephrase one rule, tighten the wording, add an
example, rephrase a condition. They are written by rules (below, seeded: a re-run writes the same
variant) and, for "rephrase_rule" and "tighten_wording", by the judge model when it is a real LLM
(`LLMWriter`); tiny-local cannot write prompts, so on it the rules write every variant.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from outcome_flywheel.models.prompts import NOTE_SECTIONS, SYSTEM_PROMPT

# The rules the base prompt already gives (role: "short, actionable"; user message: the six sections),
# spelled out: stating them changes the wording, not what is asked.
IMPLIED_RULES: tuple[str, ...] = (
    "Write the sections in this order: " + ", ".join(NOTE_SECTIONS) + ".",
    "Keep every section short.",
    "Make the Trade Recommendation actionable: a side (long or short) and a ticker.",
    "If the headline gives nothing to trade, recommend no trade and say why.",
)
# Phrasings of one rule that mean the same; "rephrase_rule" moves a rule to the next one of its group.
REPHRASINGS: tuple[tuple[str, ...], ...] = (
    (IMPLIED_RULES[0], "Use these sections, in order: " + ", ".join(NOTE_SECTIONS) + "."),
    (IMPLIED_RULES[1], "Each section takes one or two sentences.", "Be brief in every section."),
    (
        IMPLIED_RULES[2],
        "The Trade Recommendation names a ticker and a side, long or short.",
        "State the trade: long or short, and which ticker.",
    ),
    (IMPLIED_RULES[3], "If nothing in the headline is tradable, recommend no trade and give the reason."),
)
# Shorter wording of the same words (tighten_wording), applied in order to the role and every rule.
TIGHTER: tuple[tuple[str, str], ...] = (
    (r"^You are a markets analyst who writes (.*)\.$", r"Markets analyst: write \1."),
    (r"\bin this order\b", "in order"),
    (r"\bevery section\b", "each section"),
    (r"\bone or two sentences\b", "1-2 sentences"),
    (r"\band say why\b", "with the reason"),
    (r"\bgive the reason\b", "say why"),
)
EXAMPLE = (
    "Example. Headline: Nvidia beats estimates on data center demand. "
    "Trade Recommendation: Long NVDA. Timeframe: 1 day. Position Size: 2%. Stop Loss: 3% below entry."
)
# "If X, Y." <-> "Y when X." (rephrase_condition)
_IF = re.compile(r"^If (?P<cond>[^,]+), (?P<then>.+)\.$")
_WHEN = re.compile(r"^(?P<then>.+) when (?P<cond>[^,]+)\.$")


@dataclass(frozen=True)
class PromptSpec:
    """One variant of the system prompt: a role sentence, the rules it spells out, an optional example."""

    role: str = SYSTEM_PROMPT
    rules: tuple[str, ...] = ()
    example: str = ""

    def render(self) -> str:
        """The system message; the base spec gives `SYSTEM_PROMPT` unchanged."""
        parts = [self.role]
        if self.rules:
            parts.append("Rules:\n" + "\n".join(f"- {r}" for r in self.rules))
        if self.example:
            parts.append(self.example)
        return "\n".join(parts)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PromptSpec":
        raw = json.loads(text)
        return cls(role=raw["role"], rules=tuple(raw["rules"]), example=raw.get("example", ""))


BASE_SPEC = PromptSpec()


def state_rules(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    return replace(spec, rules=IMPLIED_RULES) if not spec.rules else None


def reorder_rules(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    if len(spec.rules) < 2:
        return None
    order = list(range(len(spec.rules)))
    while order == sorted(order):
        order = [int(i) for i in rng.permutation(len(spec.rules))]
    return replace(spec, rules=tuple(spec.rules[i] for i in order))


def rephrase_rule(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    known = [(i, group) for i, rule in enumerate(spec.rules) for group in REPHRASINGS if rule in group]
    if not known:
        return None
    i, group = known[int(rng.integers(len(known)))]
    rules = list(spec.rules)
    rules[i] = group[(group.index(rules[i]) + 1) % len(group)]
    return replace(spec, rules=tuple(rules))


def _tighten(text: str) -> str:
    for pattern, short in TIGHTER:
        text = re.sub(pattern, short, text)
    return text


def tighten_wording(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    tighter = replace(spec, role=_tighten(spec.role), rules=tuple(_tighten(r) for r in spec.rules))
    return tighter if tighter != spec else None


def add_example(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    return replace(spec, example=EXAMPLE) if not spec.example else None


def rephrase_condition(spec: PromptSpec, rng: np.random.Generator) -> PromptSpec | None:
    for i, rule in enumerate(spec.rules):
        if m := _IF.match(rule):
            new = f"{m['then'][0].upper()}{m['then'][1:]} when {m['cond']}."
        elif m := _WHEN.match(rule):
            new = f"If {m['cond']}, {m['then'][0].lower()}{m['then'][1:]}."
        else:
            continue
        rules = list(spec.rules)
        rules[i] = new
        return replace(spec, rules=tuple(rules))
    return None


MUTATIONS: dict[str, Callable[[PromptSpec, np.random.Generator], PromptSpec | None]] = {
    "state_rules": state_rules,
    "reorder_rules": reorder_rules,
    "rephrase_rule": rephrase_rule,
    "tighten_wording": tighten_wording,
    "add_example": add_example,
    "rephrase_condition": rephrase_condition,
}
LLM_MUTATIONS = ("rephrase_rule", "tighten_wording")
WRITER_SYSTEM = (
    "You rewrite one instruction of a prompt. Keep its meaning exactly. Answer with the rewritten instruction only."
)


class LLMWriter:
    """Rewrites one rule with a real LLM (the judge model, greedy): its answer is kept only when it is one
    line of sensible length that still names every note section the rule named; else the rules write."""

    def __init__(self, backend, name: str, max_new_tokens: int = 64):
        self.backend, self.name, self.max_new_tokens = backend, name, max_new_tokens

    def rewrite(self, rule: str, how: str) -> str | None:
        ask = "Say it in fewer words" if how == "tighten_wording" else "Say it in different words"
        answer = self.backend.greedy(
            [
                [
                    {"role": "system", "content": WRITER_SYSTEM},
                    {"role": "user", "content": f"{ask}, same meaning:\n{rule}"},
                ]
            ],
            self.max_new_tokens,
        )[0]
        return acceptable_rewrite(rule, answer)


def acceptable_rewrite(rule: str, answer: str) -> str | None:
    """The LLM's rewrite of `rule`, cleaned, or None when it is not one usable instruction."""
    text = re.sub(r"<think>.*?</think>", "", answer, flags=re.S).strip().strip('"').strip()
    text = re.sub(r"^(-|\*|\d+\.)\s*", "", text)
    if not text or "\n" in text or not 8 <= len(text) <= 2 * len(rule) + 40 or text == rule:
        return None
    if any(s.lower() in rule.lower() and s.lower() not in text.lower() for s in NOTE_SECTIONS):
        return None  # a section the rule named went missing: the logic changed
    return text if text.endswith((".", "!")) else text + "."


def mutate(
    spec: PromptSpec, rng: np.random.Generator, writer: LLMWriter | None = None
) -> tuple[PromptSpec, str, str] | None:
    """(new spec, mutation name, writer) from `spec`: a seeded choice among the mutations that apply;
    None when none changes anything."""
    names = list(MUTATIONS)
    for k in rng.permutation(len(names)):
        name = names[int(k)]
        if writer is not None and name in LLM_MUTATIONS and spec.rules:
            i = int(rng.integers(len(spec.rules)))
            rewritten = writer.rewrite(spec.rules[i], name)
            if rewritten is not None:
                rules = list(spec.rules)
                rules[i] = rewritten
                return replace(spec, rules=tuple(rules)), name, f"llm:{writer.name}"
        new = MUTATIONS[name](spec, rng)
        if new is not None and new != spec:
            return new, name, "rules"
    return None

"""`StyleScorer`: a proposal's style-match score against the latest preference adapter, with the model
kept in memory between calls (the service's `/api/preferences/style_score`, `flywheel style-score`).

The adapter is reloaded when `adapters/preference/latest` moves (or the adapter's weights change on
disk); otherwise a call only renders the plan and runs the four teacher-forced passes of
`style_match.score_candidates`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from outcome_flywheel.preferences.audit_log import Order
from outcome_flywheel.preferences.metrics import style_comment
from outcome_flywheel.preferences.status import adapter_context_keys, latest_adapter_dir
from outcome_flywheel.preferences.style_match import score_candidates, scoring_settings
from outcome_flywheel.preferences.weighting import render_plan, render_prompt


def _adapter_stamp(adapter: Path) -> tuple:
    """What identifies a loaded adapter: its folder and its files' sizes and times."""
    files = sorted(p for p in adapter.iterdir() if p.is_file())
    return (str(adapter),) + tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)


class StyleScorer:
    """Scores proposals; one loaded backend, replaced when the adapter it holds is no longer the one asked for."""

    def __init__(self, warehouse, loader=None):
        self.warehouse = warehouse
        self._loader = loader
        self._lock = threading.Lock()  # a backend is not safe to use from two threads at once
        self._backend = None
        self._stamp: tuple | None = None
        self.loads = 0  # adapters loaded so far (the service reports it; tests check the reload)

    @property
    def loader(self):
        if self._loader is None:
            from outcome_flywheel.models.loader import ModelLoader

            self._loader = ModelLoader.from_env()
        return self._loader

    def adapter(self, adapter_path: str | Path | None = None) -> Path | None:
        """The given adapter folder (which must exist) or the latest one (None before the first)."""
        if adapter_path:
            adapter = Path(adapter_path).expanduser().resolve()
            if not adapter.is_dir():
                raise FileNotFoundError(f"adapter folder {adapter} does not exist")
            return adapter
        latest = latest_adapter_dir(self.warehouse)
        return latest if latest is not None and latest.exists() else None

    def _backend_for(self, adapter: Path):
        stamp = _adapter_stamp(adapter)
        if self._backend is None or stamp != self._stamp:
            self._backend = None  # free the old model before loading the new one
            self._backend = self.loader.load(adapter_path=adapter)
            self._stamp = stamp
            self.loads += 1
        return self._backend

    def score(
        self,
        orders: Sequence[Mapping[str, Any]],
        context: Mapping[str, Any] | None = None,
        text: str | None = None,
        adapter_path: str | Path | None = None,
        prompt: str | None = None,
    ) -> dict[str, Any]:
        """{available, style_match_score, margin_logp, comment, adapter_path}: `available` is false
        (and the score None) before the first adapter exists. The prompt is rendered from `context`
        and `text` as the adapter's training pairs were, unless `prompt` gives its text verbatim.

        margin_logp = the adapter's DPO implicit reward of the rendered plan minus that of holding;
        style_match_score = sigmoid(beta * margin): P(operator prefers the plan to holding)."""
        orders = [Order.model_validate(o).model_dump(mode="json") for o in orders]  # same validation as the log
        adapter = self.adapter(adapter_path)
        if adapter is None:
            return {
                "available": False,
                "style_match_score": None,
                "margin_logp": None,
                "comment": style_comment(float("nan")),
                "adapter_path": None,
            }
        if not (adapter / "adapter_config.json").exists():
            raise FileNotFoundError(f"{adapter} is not a preference adapter folder (no adapter_config.json)")
        messages = (
            [{"role": "user", "content": prompt}]
            if prompt
            else render_prompt(context or {}, text, adapter_context_keys(adapter))
        )
        with self._lock:
            backend = self._backend_for(adapter)
            margin, score = score_candidates(backend, [messages], [render_plan(orders)], *scoring_settings(adapter))
        return {
            "available": True,
            "style_match_score": round(float(score[0]), 6),
            "margin_logp": round(float(margin[0]), 6),
            "comment": style_comment(float(score[0])),
            "adapter_path": str(adapter),
        }

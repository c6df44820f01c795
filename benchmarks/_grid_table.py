"""The figures of a learning grid (`benchmarks.learning_grid`): from its cells' held-out notes, per world, each figure
pooled over every cell with a headline-clustered bootstrap interval (`evaluation.clustered`: a headline of a day
and all its notes, of every cell, are resampled together), policy, base and policy - base (paired by headline), and
the per-cell spread. Plain pandas; the cells are the dicts `learning_grid` writes.

Per note (policy's and base's, held-out days only):
- side accuracy: among calls (long or short) on the headline's company whose headline has good or bad news, the
  share on the planted side (`news`: long on good news, short on bad; `inverted`: the reverse; `null` has no right
  side, so no accuracy, only the long share);
- long share of company calls, and its gap good news - bad news;
- calls on the company: among notes whose headline names a company the alias map knows, the share whose call is on
  it (`headline_company_share` of `evaluation.ab`);
- structure score; hit rate: the share of matured calls with vs_spy_pct > 0; with it, the A/B's own test and label
  (`evaluation.ab_stats.session_comparison`, the unit the entry session) per cell and over the pooled cells.
Per cell: the KL of the trained policy to the base (`policy_training`, the last training day) and the gate's
rejections over the training days. Between worlds: the share of held-out headlines (naming a company) on which the
`news` and `inverted` policies of one (world seed, training seed) take opposite majority sides.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.evaluation.clustered import (
    SumsStatistic,
    clustered_difference,
    clustered_interval,
    gap_of,
    mean_of,
)

RULE_SIGN = {"news": 1, "inverted": -1, "null": 0}
SIDE_SIGN = {"long": 1, "short": -1}


def cell_name(world: str, world_seed: int, train_seed: int) -> str:
    return f"{world}-w{world_seed}-t{train_seed}"


def frame_of(split: dict | None) -> pd.DataFrame:
    """A frame stored as pandas' `to_json(orient="split")`."""
    if not split:
        return pd.DataFrame()
    return pd.DataFrame(split["data"], columns=split["columns"])


def note_values(notes: pd.DataFrame, world: str) -> pd.DataFrame:
    """`notes` (outcome_learning.NOTE_COLUMNS) with the per-note values the figures average (NaN: not counted)."""
    company = notes["company_call"].astype(bool)
    sign = notes["side"].map(SIDE_SIGN).fillna(0).to_numpy()
    news = pd.to_numeric(notes["news"], errors="coerce").fillna(0).to_numpy()
    right = news * RULE_SIGN[world]
    matured = (notes["status"] == "matured").to_numpy()
    vs_spy = pd.to_numeric(notes["vs_spy_pct"], errors="coerce").to_numpy()
    return notes.assign(
        long=np.where(company, (sign > 0).astype(float), np.nan),
        good=company & (news > 0),
        bad=company & (news < 0),
        correct=np.where(company & (right != 0), (sign == right).astype(float), np.nan),
        relevance=np.where(notes["names_company"].astype(bool), company.astype(float), np.nan),
        hit=np.where(matured & ~np.isnan(vs_spy), (vs_spy > 0).astype(float), np.nan),
        structure=pd.to_numeric(notes["structure_score"], errors="coerce"),
    )


def figures(world: str) -> dict[str, SumsStatistic]:
    out = {} if world == "null" else {"side_accuracy": mean_of("correct")}
    out.update(
        long_share=mean_of("long"),
        long_gap_good_minus_bad=gap_of("long", "good", "bad"),
        company_share=mean_of("relevance"),
        structure=mean_of("structure"),
        hit_rate=mean_of("hit"),
    )
    return out


def _r(value, digits: int = 4):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return round(value, digits) if math.isfinite(value) else None


def _interval(result: dict) -> dict:
    return dict(
        estimate=_r(result["estimate"]),
        ci=[_r(result["low"]), _r(result["high"])],
        se=_r(result["se"]),
        clusters=result["clusters"],
        n=result["n"],
    )


def spread(values) -> dict:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return dict(
        mean=_r(np.mean(values)) if values else None,
        min=_r(min(values)) if values else None,
        max=_r(max(values)) if values else None,
        n=len(values),
        values=[_r(v) for v in values],
    )


def world_table(cells: list[dict], world: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """The figures of one world over its cells (each cell a dict as `learning_grid` writes it)."""
    notes = [note_values(frame_of(c["notes"]), world).assign(cell=c["name"]) for c in cells]
    pooled = pd.concat(notes, ignore_index=True) if notes else pd.DataFrame()
    out: dict = dict(cells=[c["name"] for c in cells])
    if pooled.empty:
        return out
    policy, base = pooled[pooled["source"] == "policy"], pooled[pooled["source"] == "base"]
    for name, stat in figures(world).items():
        out[name] = dict(
            policy=_interval(clustered_interval(policy, stat, n_boot=n_boot, seed=seed)),
            base=_interval(clustered_interval(base, stat, n_boot=n_boot, seed=seed)),
            difference=_interval(clustered_difference(policy, base, stat, n_boot=n_boot, seed=seed)),
            per_cell_policy=spread([stat(f[f["source"] == "policy"]) for f in notes]),
            per_cell_base=spread([stat(f[f["source"] == "base"]) for f in notes]),
        )
    out["hit_rate_ab"] = dict(
        pooled=pooled_hit_rate_test(pooled),
        per_cell_labels=[(c["held_out"]["ab"].get("hit_rate") or {}).get("label") for c in cells],
    )
    out["kl_to_base"] = spread([last_training(c, "kl_to_base") for c in cells])
    rejections = [
        sum(1 for d in c["per_day"] if d.get("phase") == "train" and d.get("gate") == "rejected") for c in cells
    ]
    out["gate_rejections"] = dict(total=int(sum(rejections)), per_cell=rejections)
    return out


def last_training(cell: dict, key: str):
    values = [d.get(key) for d in cell["per_day"] if d.get("phase") == "train" and d.get(key) is not None]
    return values[-1] if values else None


def pooled_hit_rate_test(pooled: pd.DataFrame) -> dict:
    """The A/B's hit-rate test (evaluation.ab's session comparison) over every cell's matured calls: the unit is the
    entry session, each cell's headline its own pair."""
    from outcome_flywheel.daily_rl.evaluation.ab import outcome_horizon, sessions_of
    from outcome_flywheel.daily_rl.evaluation.ab_stats import session_comparison

    matured = pooled[pooled["status"] == "matured"].copy()
    if matured.empty:
        return dict(label="not enough data", n=0)
    matured["headline_id"] = matured["cell"].astype(str) + "/" + matured["headline_id"].astype(str)
    matured = sessions_of(matured.assign(horizon_sessions=1)).assign(hit=lambda f: (f["vs_spy_pct"] > 0).astype(float))
    sides = [matured[matured["source"] == s] for s in ("policy", "base")]
    c = session_comparison("hit_rate", sides[0], sides[1], "hit", outcome_horizon(matured))
    return dict(
        policy=_r(c.policy),
        base=_r(c.base),
        difference=_r(c.difference),
        ci=[_r(c.ci_low), _r(c.ci_high)],
        n_sessions=int(c.n),
        p_value=_r(c.p_value),
        label=c.label,
    )


def opposite_sides(cells: list[dict], n_boot: int = 2000, seed: int = 0) -> dict | None:
    """Share of held-out headlines naming a company on which the `news` and `inverted` policies of one (world seed,
    training seed) take opposite majority sides: pooled with a headline-clustered interval, and per pair."""
    by = {(c["world"], c["world_seed"], c["train_seed"]): c for c in cells}
    frames, per_pair = [], {}
    for (world, ws, ts), cell in sorted(by.items()):
        other = by.get(("inverted", ws, ts))
        if world != "news" or other is None:
            continue
        a, b = frame_of(cell["sides"]), frame_of(other["sides"])
        both = a.merge(b, on=["date", "headline_id"], suffixes=("_a", "_b"))
        both = both[both["names_company_a"].astype(bool)]
        product = both["policy_side_a"] * both["policy_side_b"]
        both = both.assign(
            opposite=(product < 0).astype(float), sided=np.where(product != 0, (product < 0).astype(float), np.nan)
        )
        per_pair[f"w{ws}-t{ts}"] = dict(
            share=_r(both["opposite"].mean()) if len(both) else None,
            headlines=len(both),
            share_where_both_take_a_side=_r(both["sided"].mean()) if both["sided"].notna().any() else None,
        )
        frames.append(both)
    if not frames:
        return None
    pooled = pd.concat(frames, ignore_index=True)
    return dict(
        share=_interval(clustered_interval(pooled, mean_of("opposite"), n_boot=n_boot, seed=seed)),
        share_where_both_take_a_side=_interval(clustered_interval(pooled, mean_of("sided"), n_boot=n_boot, seed=seed)),
        per_pair=per_pair,
        per_pair_spread=spread([p["share"] for p in per_pair.values()]),
    )


def _figure(x: dict | None) -> str:
    """`estimate [low, high]` of one pooled figure, `-` where the grid has none."""
    if not x or x.get("estimate") is None:
        return "-"
    low, high = (f"{v:.3f}" if v is not None else "-" for v in x["ci"])
    return f"{x['estimate']:.3f} [{low}, {high}]"


def print_table(results: dict) -> None:
    """The table in plain text: per world, each figure's policy, base and difference with their 95% intervals."""
    print(f"\n== arm {results['arm']}: {results['cells']['done']} of {results['cells']['expected']} cells ==")
    for world, table in results["worlds"].items():
        print(f"\n-- {world} ({len(table.get('cells', []))} cells) --")
        print(f"  {'figure':<26}{'policy':<26}{'base':<26}{'policy - base':<28}per-cell policy [min, max]")
        for name, row in table.items():
            if isinstance(row, dict) and "policy" in row and isinstance(row["policy"], dict) and "ci" in row["policy"]:
                cell = row["per_cell_policy"]
                print(
                    f"  {name:<26}{_figure(row['policy']):<26}{_figure(row['base']):<26}{_figure(row['difference']):<28}"
                    f"[{cell['min']}, {cell['max']}]"
                )
        ab = table.get("hit_rate_ab", {})
        pooled = ab.get("pooled", {})
        print(
            f"  hit rate, the A/B's test over {pooled.get('n_sessions')} pooled sessions: difference "
            f"{pooled.get('difference')} {pooled.get('ci')}: {pooled.get('label')}; per cell: {ab.get('per_cell_labels')}"
        )
        kl = table.get("kl_to_base", {})
        print(f"  KL to base (last training day) mean {kl.get('mean')} [{kl.get('min')}, {kl.get('max')}]")
        print(f"  gate rejections: {table.get('gate_rejections')}")
    opposite = results.get("opposite_sides")
    if opposite:
        print(
            f"\n  news vs inverted, opposite sides: {_figure(opposite['share'])} over "
            f"{opposite['share']['clusters']} headlines; per pair {opposite['per_pair_spread']['values']}"
        )


def ablation_rows(entries: list[dict]) -> list[dict]:
    """One row per recorded arm and grid (`learning_grid.json`'s entries, in their order): the issue's figures, each
    with its 95% interval. Side accuracy and hit rate are the policy's; calls on the company and the null world's
    long-share gap are policy - base (the goals are relative to the base); opposite sides pairs news with inverted."""
    rows = []
    for e in entries:
        worlds, grid = e.get("worlds") or {}, e["grid"]
        row = dict(
            arm=e["arm"],
            grid=f"{grid['days']} d, {len(grid['world_seeds'])} w x {len(grid['train_seeds'])} t",
            cells=f"{e['cells']['done']}/{e['cells']['expected']}",
            date=str(e.get("date", ""))[:10],
        )
        for world in ("news", "inverted"):
            table = worlds.get(world) or {}
            row[f"side {world}"] = _figure((table.get("side_accuracy") or {}).get("policy"))
            row[f"company {world}"] = _figure((table.get("company_share") or {}).get("difference"))
            row[f"hit {world}"] = _figure((table.get("hit_rate") or {}).get("policy"))
        row["opposite"] = _figure((e.get("opposite_sides") or {}).get("share"))
        row["null gap"] = _figure(((worlds.get("null") or {}).get("long_gap_good_minus_bad") or {}).get("difference"))
        labels = [
            label
            for table in worlds.values()
            for label in (table.get("hit_rate_ab") or {}).get("per_cell_labels") or []
            if label is not None
        ]
        row["better"] = f"{labels.count('better')}/{len(labels)}" if labels else "-"
        row["rejections"] = sum(int((t.get("gate_rejections") or {}).get("total", 0)) for t in worlds.values())
        rows.append(row)
    return rows


def ablation_markdown(rows: list[dict]) -> str:
    """The rows as one markdown table (the closing note's and docs' form)."""
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines)

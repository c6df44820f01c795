"""Synthetic worlds where the answer is known: price files in which the archive's news does (or does
not) move its company. Plain Python; `flywheel make-world` writes one, `benchmarks.outcome_learning`
runs the daily loop on each.

The daily loop takes two things from the world: the closes (`FLYWHEEL_PRICES_FILE`) and, for its judge,
what happened next (`world_outcome_titles`: one follow-up per company stating the world's own move, up to
the last close the judge may know, in place of the archive's next-day headlines, whose moves are real
ones). So a world is a price file over the bundled price file's dates and symbols, in its exact format (`date, symbol,
close`, six decimals), with a sidecar `<file>.world.json` that states the rule, the options and every
planted move. Every figure in it is SYNTHETIC: no row is a real price.

Every symbol walks at random around the market: SPY's return each session, in percent, is
`drift_pct + noise_pct * z_SPY`, and every stock's `drift_pct + market_beta * noise_pct * z_SPY + noise_pct * z`
(z standard normal, seeded; one z per symbol and session). With the default beta 1 a stock carries the
market and its own noise, so a call's vs_spy is the planted move plus noise, as with real stocks; with
beta 0 (the worlds before) SPY walks apart from every stock and vs_spy carries -side * r_SPY, the same
sign for every call exiting on a session: a Buy-always or Sell-always bias would be the cheapest thing
to fit. On top of that, in
- `news`: each archive headline's company (`notes.relevance.headline_symbols`) moves `move_pct` in the
  direction of the headline's news (`news.news_direction`: good up, bad down) at the first session
  its note can see: the session after the entry session (a note of day D enters at the close of the
  first session after D, `notes.outcomes.call_window`, so a move at that entry session would be invisible
  to every call; a Friday's headline moves its company on Tuesday). Headlines of one company landing
  on one session add up as signs (good + bad = no move: over a weekend, Friday's, Saturday's and
  Sunday's notes share one window, so with the bundled archive about 15% of headlines land in a group
  that cancels and 6% in one whose net news is the other way; `max_headlines` builds the world from the
  headlines the loop reads, which leaves fewer such clashes);
- `inverted`: the same with the direction reversed;
- `null`: no planted move, random walks only.
One seed draws the same z in every kind, so the three worlds of a seed differ only by the rule.
The headlines may be a SYNTHETIC archive (`synthetic_feeds.py`: more days, no clashing news); the manifest
then says so (`synthetic_headlines`, `archive_manifest`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from outcome_flywheel.daily_rl.feeds.headlines import build_headlines
from outcome_flywheel.daily_rl.feeds.source import DEFAULT_ARCHIVE, FeedSource
from outcome_flywheel.daily_rl.notes.outcomes import BENCHMARK, call_window
from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.daily_rl.worlds.synthetic_feeds import company_mention, read_archive_manifest
from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
from outcome_flywheel.settings import env, resolve_path
from outcome_flywheel.storage import atomic_write_bytes
from outcome_flywheel.trading_sessions import session_on_or_before

WORLD_KINDS = ("news", "inverted", "null")
RULE_SIGN = {"news": 1, "inverted": -1, "null": 0}
RULES = {
    "news": "the headline's company moves move_pct in the direction of its news (good up, bad down) at the session after its entry session",
    "inverted": "the headline's company moves move_pct against the direction of its news (good down, bad up) at the session after its entry session",
    "null": "no planted move: every symbol walks at random",
}
PLANTED_COLUMNS = ["session", "symbol", "direction", "move_pct", "headline_ids"]
EVENT_COLUMNS = ["date", "headline_id", "title", "summary", "symbol", "news", "move_session"]


@dataclass(frozen=True)
class WorldConfig:
    """What a world is made of; every field is a `flywheel make-world` option."""

    kind: str = "news"
    seed: int = 0
    move_pct: float = 2.0  # size of a planted move, percent of the close
    noise_pct: float = 1.0  # standard deviation of every symbol's daily return, percent
    drift_pct: float = 0.0  # mean daily return of every symbol, percent
    market_beta: float = 1.0  # each stock's exposure to SPY's noise (0: stocks walk apart from the market)

    def __post_init__(self):
        if self.kind not in WORLD_KINDS:
            raise ValueError(f"world kind must be one of {', '.join(WORLD_KINDS)}, got {self.kind!r}")
        for name in ("move_pct", "noise_pct", "drift_pct", "market_beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.move_pct < 0 or self.noise_pct < 0:
            raise ValueError(
                f"move_pct and noise_pct must be >= 0 (a size and a standard deviation), got {self.move_pct}, {self.noise_pct}"
            )
        reach = abs(self.drift_pct) + self.move_pct + 6 * self.noise_pct * (1 + abs(self.market_beta))
        if reach >= 100:
            raise ValueError(
                "drift_pct, move_pct, noise_pct and market_beta this large would take closes to zero or below: keep "
                f"|drift| + move + 6 * noise * (1 + |beta|) under 100 (got {reach:g})"
            )


def archive_events(
    archive_dir: str | Path = DEFAULT_ARCHIVE, tz: str = "America/New_York", max_headlines: int | None = None
) -> pd.DataFrame:
    """The archive's headlines, one row per company each is about, with its news (+1, -1, 0) and the
    session a planted move lands on (EVENT_COLUMNS). `max_headlines`: each day's headlines as the loop
    reads them under that cap (FLYWHEEL_MAX_HEADLINES; the same ones the `headlines` asset keeps); None: all."""
    folder = resolve_path(str(archive_dir))
    days = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not days:
        raise FileNotFoundError(f"feed archive {folder} has no day folders (YYYY-MM-DD/*.xml)")
    source = FeedSource(archive_dir=str(folder))
    rows = []
    for day in days:
        headlines, _, _ = build_headlines(
            source.fetch(day), day, tz, max_headlines=10**9 if max_headlines is None else max_headlines
        )
        if headlines.empty:
            continue
        landing = call_window(day, 1)
        for h in headlines.itertuples(index=False):
            for symbol in headline_symbols(h.title, h.summary):
                rows.append(
                    dict(
                        date=day,
                        headline_id=h.headline_id,
                        title=h.title,
                        summary=h.summary,
                        symbol=symbol,
                        news=news_direction(h.title, h.summary),
                        move_session=landing.exit_date,
                    )
                )
    return pd.DataFrame(rows, columns=EVENT_COLUMNS)


def planted_moves(events: pd.DataFrame, config: WorldConfig) -> pd.DataFrame:
    """The moves the rule plants (PLANTED_COLUMNS): per (session, symbol), the sign of the summed news
    times the rule's sign, in percent; nothing in `null` and where the news cancels out."""
    sign = RULE_SIGN[config.kind]
    news = events[events["news"] != 0]
    if sign == 0 or config.move_pct == 0 or news.empty:
        return pd.DataFrame(columns=PLANTED_COLUMNS)
    grouped = news.groupby(["move_session", "symbol"], sort=True)
    out = pd.DataFrame(
        {"net": grouped["news"].sum(), "headline_ids": grouped["headline_id"].agg(lambda s: "|".join(sorted(set(s))))}
    ).reset_index()
    out = out[out["net"] != 0]
    out["direction"] = np.sign(out["net"]).astype(int) * sign
    out["move_pct"] = out["direction"] * float(config.move_pct)
    return out.rename(columns={"move_session": "session"})[PLANTED_COLUMNS].reset_index(drop=True)


def world_prices(config: WorldConfig, template: pd.DataFrame, planted: pd.DataFrame) -> pd.DataFrame:
    """Closes over `template`'s dates and symbols (`date, symbol, close`): each symbol starts at its first
    close in the template, then returns drift + noise * z (+ beta * noise * z_SPY for a stock), plus the
    planted moves."""
    dates = sorted(template["date"].unique())
    symbols = sorted(template["symbol"].unique())
    z = np.random.default_rng(config.seed).standard_normal((len(dates), len(symbols)))
    returns = config.drift_pct + config.noise_pct * z
    if BENCHMARK in symbols and config.market_beta:  # every stock carries the market's move
        market = z[:, symbols.index(BENCHMARK)]
        stocks = np.array([s != BENCHMARK for s in symbols])
        returns[:, stocks] += config.market_beta * config.noise_pct * market[:, None]
    returns[0, :] = 0.0  # the first date is the starting close
    row, col = {d: i for i, d in enumerate(dates)}, {s: j for j, s in enumerate(symbols)}
    for p in planted.itertuples(index=False):
        if p.session in row and p.symbol in col and row[p.session] > 0:
            returns[row[p.session], col[p.symbol]] += p.move_pct
    first = template.sort_values("date").groupby("symbol")["close"].first().reindex(symbols).to_numpy(dtype=float)
    closes = first * np.cumprod(1.0 + returns / 100.0, axis=0)
    if not (closes > 0).all():
        raise ValueError("a close went to zero or below: lower noise_pct, move_pct or |drift_pct|")
    frame = pd.DataFrame(closes, index=dates, columns=symbols).rename_axis(index="date", columns="symbol")
    long = frame.stack().rename("close").reset_index()
    return long.sort_values(["symbol", "date"]).reset_index(drop=True)[["date", "symbol", "close"]]


def make_world(
    config: WorldConfig,
    archive_dir: str | Path = DEFAULT_ARCHIVE,
    template_file: str | Path = BUNDLED_PRICES,
    tz: str = "America/New_York",
    max_headlines: int | None = None,
) -> tuple[pd.DataFrame, dict]:
    """(the world's closes, its manifest): the rule applied to the archive's headlines (each day's first
    `max_headlines`, as the loop reads them; None: all) over the template price file's dates and symbols
    (default: the bundled prices)."""
    template = read_price_file(resolve_path(str(template_file)))
    if BENCHMARK not in set(template["symbol"]):
        raise ValueError(f"template price file {template_file} has no {BENCHMARK}: the calls are measured against it")
    events = archive_events(archive_dir, tz, max_headlines)
    planted = planted_moves(events, config)
    dates, symbols = set(template["date"]), set(template["symbol"])
    landed = planted[
        planted["session"].isin(dates) & planted["symbol"].isin(symbols) & (planted["session"] > min(dates))
    ]
    prices = world_prices(config, template, landed)
    news = events[events["news"] != 0]
    feeds = read_archive_manifest(archive_dir)
    manifest = dict(
        synthetic=True,
        note="SYNTHETIC prices written by `flywheel make-world`: no row is a real price.",
        **asdict(config),
        rule=RULES[config.kind],
        archive=str(resolve_path(str(archive_dir))),
        max_headlines=max_headlines,
        template=str(resolve_path(str(template_file))),
        synthetic_headlines=bool(feeds and feeds.get("synthetic")),
        archive_manifest=None
        if feeds is None
        else {k: feeds.get(k) for k in ("seed", "days", "headlines_per_day", "first_day", "last_day")},
        first_date=min(dates),
        last_date=max(dates),
        symbols=len(symbols),
        headlines=int(events["headline_id"].nunique()),
        headlines_with_news=int(news["headline_id"].nunique()),
        planted_moves=len(landed),
        not_planted=dict(
            cancelled=int(len(news.groupby(["move_session", "symbol"])) - len(planted))
            if RULE_SIGN[config.kind] and config.move_pct
            else 0,
            symbol_not_in_prices=int((~planted["symbol"].isin(symbols)).sum()),
            session_not_in_prices=int((~planted["session"].isin(dates) | (planted["session"] <= min(dates))).sum()),
        ),
        planted=landed.to_dict(orient="records"),
    )
    return prices, manifest


def price_csv(prices: pd.DataFrame) -> bytes:
    """The bundled price file's exact format: `date,symbol,close`, six decimals, by symbol then date."""
    return prices.to_csv(index=False, float_format="%.6f", lineterminator="\n").encode()


def check_world_path(path: Path) -> Path:
    """`path` if a world can be written there (a .csv file path), else ValueError saying why."""
    if path.is_dir():
        raise ValueError(f"world file {path} is a folder; give a file path ending in .csv")
    if path.suffix.lower() != ".csv":
        raise ValueError(
            f"world file {path} must end in .csv (a world is written in the bundled price file's CSV format)"
        )
    return path


def manifest_path(prices_path: str | Path) -> Path:
    path = Path(prices_path)
    return path.with_name(path.name + ".world.json")


def write_world(path: str | Path, prices: pd.DataFrame, manifest: dict) -> dict:
    """Write the price file and its manifest (each atomically); the manifest gains the file's sha256."""
    path = Path(path)
    data = price_csv(prices)
    manifest = dict(manifest, file=path.name, rows=len(prices), sha256=hashlib.sha256(data).hexdigest())
    atomic_write_bytes(path, data)
    atomic_write_bytes(manifest_path(path), (json.dumps(manifest, indent=1, default=str) + "\n").encode())
    return manifest


# -- what the judge may read of a world: its own closes, up to the morning it runs ----------------------------


def world_prices_path(world: str | Path | None) -> Path | None:
    """The world's price file from it or its `.world.json`; None when `world` is unset or has no sidecar
    (a real price file, e.g. the bundled one: the judge reads the archive's next-day headlines as before)."""
    if not world:
        return None
    path = resolve_path(str(world))
    if path.name.endswith(".world.json"):
        path = path.with_name(path.name[: -len(".world.json")])
    return path if manifest_path(path).is_file() and path.is_file() else None


@lru_cache(maxsize=8)
def _closes(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    return read_price_file(path).pivot(index="date", columns="symbol", values="close")


def _move(closes: pd.DataFrame, symbol: str, start: str, end: str) -> float | None:
    try:
        a, b = float(closes.at[start, symbol]), float(closes.at[end, symbol])
    except KeyError:
        return None
    return round(100.0 * (b / a - 1.0), 1) if a > 0 and b == b else None


def _stated(name: str, move: float, market: float | None, when: str) -> str:
    said = f"rose {move:.1f}%" if move > 0 else f"fell {-move:.1f}%" if move < 0 else "were flat (0.0%)"
    return f"{name} shares {said}" + ("" if market is None else f" (market {market:+.1f}%)") + f" {when}"


def world_outcome_titles(
    world: str | Path | None,
    headlines: pd.DataFrame,
    prediction_day: str,
    horizon: int = 1,
    outcome_day: str | None = None,
) -> list[str] | None:
    """What happened next, in a world: one follow-up title per company the prediction day's headlines are
    about (`notes.relevance.headline_symbols`), stating that company's move in the world's closes and naming it
    as the headline did (so `judge.outcome_context` puts it first); in symbol order. None when `world`
    (a price file or its `.world.json`) is not a world. `headlines`: title and summary columns (D-1's
    headlines, or its rollouts: a company is stated once).

    No close after the judge's knowledge cutoff is read: the judge of D (`outcome_day`, default the day
    after `prediction_day`) runs the morning after D, so it knows the closes of sessions dated <= D. The
    call window of a note of D-1 (`notes.outcomes.call_window`: entry at the first session after D-1, exit h
    sessions later) always ends after D, so its move is never known yet. The follow-up then states what
    is: the company's move since the note was written, from the last close on or before D-1 to the last
    close on or before D (on a session day D, D's own session: the entry session, before the planted
    move, which lands on the exit session), and that the window's exit close is not in yet; with no
    session in between (a weekend, a holiday), that there is no close yet. Only a later cutoff (`outcome_day` on or
    after the exit) states the window's move itself, entry close to exit close. SPY's move over the same
    closes is given as "market"."""
    path = world_prices_path(world)
    if path is None:
        return None
    stat = path.stat()
    closes = _closes(str(path), stat.st_mtime_ns, stat.st_size)
    cutoff = outcome_day or (pd.Timestamp(prediction_day) + pd.Timedelta(days=1)).date().isoformat()
    window = call_window(prediction_day, horizon)
    base, last = session_on_or_before(prediction_day), session_on_or_before(cutoff)
    names: dict[str, str] = {}
    summaries = headlines["summary"] if "summary" in headlines else [None] * len(headlines)
    for title, summary in zip(headlines["title"], summaries):
        for symbol in headline_symbols(title, summary):
            names.setdefault(symbol, company_mention(title, symbol) or company_mention(summary, symbol) or symbol)
    out = []
    for symbol in sorted(
        s for s in names if s in closes.columns
    ):  # a company the world has no closes of: nothing to state
        name = names[symbol] if names[symbol] == symbol else f"{names[symbol]} ({symbol})"
        if window.exit_date <= cutoff:
            start, end = window.entry_date, window.exit_date
            when = f"from the {start} close to the {end} close, the call's window"
        elif last is not None and base is not None and last > base:
            start, end = base, last
            when = (
                f"in the {end} session"
                if session_on_or_before((pd.Timestamp(end) - pd.Timedelta(days=1)).date().isoformat()) == base
                else f"from the {start} close to the {end} close"
            ) + f"; the call's exit close ({window.exit_date}) is not in yet"
        else:
            out.append(
                f"{name} shares: no close yet since {prediction_day}; the call's window runs from the {window.entry_date} "
                f"close to the {window.exit_date} close (world prices, SYNTHETIC)"
            )
            continue
        move = _move(closes, symbol, start, end)
        if move is not None and start <= cutoff and end <= cutoff:
            out.append(f"{_stated(name, move, _move(closes, BENCHMARK, start, end), when)} (world prices, SYNTHETIC)")
    return out


def judge_outcome_titles(
    prices_file: str | Path | None, headlines: pd.DataFrame, prediction_day: str
) -> list[str] | None:
    """For the scoring step: `world_outcome_titles` with the horizon of FLYWHEEL_OUTCOME_HORIZON and the
    judge of the day after `prediction_day`; None for a real price file (keep the archive's headlines)."""
    return world_outcome_titles(prices_file, headlines, prediction_day, int(env("FLYWHEEL_OUTCOME_HORIZON")))

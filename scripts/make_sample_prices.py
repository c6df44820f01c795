"""Write the flywheel's bundled offline prices: `sample_data/prices/daily_close.csv`.

A subset (2025-06-02 .. 2026-01-08, all 52 symbols, columns date, symbol, close) of the real
adjusted closes in `../shared/data/prices/daily_close.csv` (Yahoo Finance via yfinance, see that
folder's PROVENANCE.md). Nothing is computed or filled: rows are copied as they are.

    python -m scripts.make_sample_prices [--source PATH]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pandas as pd

from outcome_flywheel.settings import PROJECT_ROOT, SAMPLE_DATA

SOURCE = PROJECT_ROOT.parent / "shared" / "data" / "prices" / "daily_close.csv"
TARGET = SAMPLE_DATA / "prices" / "daily_close.csv"
START, END = "2025-06-01", "2026-01-08"

PROVENANCE = """# Provenance: bundled offline prices for the preference flywheel

`daily_close.csv` (columns `date, symbol, close`; {rows} rows; {n_symbols} symbols; {first} .. {last},
{sessions} NYSE sessions; sha256 `{sha}`) is a subset of `../shared/data/prices/daily_close.csv`
written by `python -m scripts.make_sample_prices`. Rows are copied unchanged; only the date range
and the columns were cut.

Where the figures come from (from the source file's PROVENANCE.md): real daily closes from Yahoo
Finance, downloaded with `yfinance` (`auto_adjust=True`, so `close` is the split- and
dividend-adjusted close as of 2026-01-08) and committed to github.com/AnirudhK005/TraderPro
(data files last changed in commit b0ad6e5b2dbb6d04a2d41c871b76b187bc05f5d0). No licence is stated
there, and Yahoo's terms limit redistribution: use these figures as internal test fixtures only.
The sessions match the exchange_calendars XNYS calendar exactly (half days 2025-07-03,
2025-11-28 and 2025-12-24 are sessions).

Symbols: {symbols}
"""


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args(argv)
    df = pd.read_csv(args.source, usecols=["date", "symbol", "close"], dtype={"date": str, "symbol": str})
    df = df[(df["date"] >= START) & (df["date"] <= END)].sort_values(["symbol", "date"]).reset_index(drop=True)
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(TARGET, index=False, float_format="%.6f")
    sha = hashlib.sha256(TARGET.read_bytes()).hexdigest()
    (TARGET.parent / "PROVENANCE.md").write_text(
        PROVENANCE.format(
            rows=len(df),
            n_symbols=df["symbol"].nunique(),
            first=df["date"].min(),
            last=df["date"].max(),
            sessions=df["date"].nunique(),
            sha=sha,
            symbols=" ".join(sorted(df["symbol"].unique())),
        )
    )
    print(f"wrote {TARGET} ({len(df)} rows, {df['symbol'].nunique()} symbols, {df['date'].min()}..{df['date'].max()})")
    return TARGET


if __name__ == "__main__":
    main()

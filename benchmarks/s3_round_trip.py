"""The warehouse's round trip on object storage beside the local folder, in one run: a SeaweedFS
started on 127.0.0.1 (tests/s3_server.py) and a temp folder, the same Warehouse calls on both.

Tables: `rollouts` as one day of the daily loop writes it at full size (30 headlines x 8 notes of
~512 tokens: text, token ids and logprobs; synthetic values, the real columns), and a ~10 MB table of
random numbers (incompressible). Per table and store: write (Warehouse.write: Parquet built in memory,
then the atomic rename or the one upload), read (Warehouse.read) and a DuckDB count through the
registered filesystem (Warehouse.query), each the median of `--repeats`; then a table of 60 small daily
partitions (two months of operator decisions) read whole by `read_all`. The last line is one JSON object.

    python -m benchmarks.s3_round_trip [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._results import add_record_argument, finish


def rollouts_day(headlines: int = 30, notes: int = 8, tokens: int = 512, seed: int = 0) -> pd.DataFrame:
    """A day of `rollouts` with the loop's columns: headline texts, prompts, notes, token ids, logprobs."""
    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_COLUMNS

    rng = np.random.default_rng(seed)
    words = np.array(
        "the company said shares rose fell after guidance revenue quarter margin demand outlook cut raised".split()
    )
    rows = []
    for h in range(headlines):
        title = " ".join(rng.choice(words, 12))
        summary = " ".join(rng.choice(words, 60))
        for i in range(notes):
            n = int(rng.integers(tokens // 2, tokens))
            rows.append(
                {
                    "date": "2025-11-04",
                    "headline_id": f"h{h:04d}",
                    "rollout_index": i,
                    "title": title,
                    "summary": summary,
                    "prompt": f"Headline: {title}\n{summary}\nWrite a trading note.",
                    "response": " ".join(rng.choice(words, n)),
                    "response_ids": rng.integers(0, 50_000, n).tolist(),
                    "n_tokens": n,
                    "finished": bool(rng.random() < 0.9),
                    "structure_score": float(rng.random()),
                    "behavior_logprobs": (-rng.exponential(1.0, n)).tolist(),
                    "temperature": 1.0,
                    "policy_version": "2025-11-03-abc123",
                    "seed": h * notes + i,
                    "max_new_tokens": tokens,
                }
            )
    return pd.DataFrame(rows, columns=ROLLOUT_COLUMNS)


def numbers_10mb(seed: int = 0) -> pd.DataFrame:
    """~10 MB of Parquet: 5 columns of random float64 (no compression to be had)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({f"c{i}": rng.random(262_144) for i in range(5)})


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def measure(warehouse, tables: dict[str, pd.DataFrame], repeats: int) -> dict:
    out = {}
    for name, frame in tables.items():
        write_ms = _median_ms(lambda: warehouse.write(name, frame, partition="2025-11-04"), repeats)
        read_ms = _median_ms(lambda: warehouse.read(name, "2025-11-04"), repeats)
        query_ms = _median_ms(lambda: warehouse.query(f"SELECT count(*) AS n FROM {name}"), repeats)
        assert len(warehouse.read(name, "2025-11-04")) == len(frame)
        stored = warehouse.stat(name, "2025-11-04")
        out[name] = {
            "rows": len(frame),
            "parquet_mb": round(stored.size / 2**20, 2),
            "write_ms": write_ms,
            "read_ms": read_ms,
            "duckdb_count_ms": query_ms,
        }
    return out


def many_partitions(warehouse, repeats: int, days: int = 60) -> dict:
    """`read_all` of a table with `days` partitions of 20 rows (one request per partition on S3)."""
    dates = pd.date_range("2025-06-02", periods=days, freq="D").strftime("%Y-%m-%d")
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for d in dates:
        warehouse.write(
            "decisions",
            pd.DataFrame({"decision_id": [f"{d}-{i}" for i in range(20)], "weight": rng.random(20)}),
            partition=d,
        )
    write_ms = (time.perf_counter() - started) * 1000
    read_ms = _median_ms(lambda: warehouse.read_all("decisions"), repeats)
    assert len(warehouse.read_all("decisions")) == 20 * days
    return {"partitions": days, "write_all_ms": round(write_ms, 1), "read_all_ms": read_ms}


def run(repeats: int = 5) -> dict:
    from outcome_flywheel.storage import Warehouse
    from tests.s3_server import s3_server

    tables = {"rollouts": rollouts_day(), "numbers": numbers_10mb()}
    with tempfile.TemporaryDirectory(prefix="s3-round-trip-") as tmp:
        local = Warehouse(data_dir=str(Path(tmp) / "local"))
        result = {"local": measure(local, tables, repeats)}
        result["local"]["decisions_60_days"] = many_partitions(local, repeats)
        with s3_server(Path(tmp) / "seaweedfs") as server:
            env = server.env("bench")
            os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
            remote = Warehouse(
                data_dir=str(Path(tmp) / "s3"),
                warehouse_url=env["FLYWHEEL_WAREHOUSE_URL"],
                s3_endpoint=env["FLYWHEEL_S3_ENDPOINT"],
            )
            result["seaweedfs"] = measure(remote, tables, repeats)
            result["seaweedfs"]["decisions_60_days"] = many_partitions(remote, repeats)
    return {
        "benchmark": "s3_round_trip",
        "repeats": repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "server": "SeaweedFS (weed server -s3) on 127.0.0.1, same machine",
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_record_argument(parser)
    args = parser.parse_args()
    result = run(args.repeats)
    for store in ("local", "seaweedfs"):
        for name, row in result[store].items():
            if "partitions" in row:
                print(
                    f"{store:10s} {name}: write {row['write_all_ms']:.0f} ms (one by one), read_all {row['read_all_ms']:.1f} ms"
                )
                continue
            print(
                f"{store:10s} {name:9s} {row['parquet_mb']:6.2f} MB  write {row['write_ms']:8.1f} ms  read {row['read_ms']:8.1f} ms  "
                f"duckdb count {row['duckdb_count_ms']:7.1f} ms"
            )
    finish("s3_round_trip", result, args.record)


if __name__ == "__main__":
    main()

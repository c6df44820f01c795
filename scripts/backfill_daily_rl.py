"""Launch an *asset* backfill of the daily loop on a running Dagster webserver (headless).

An asset backfill honours `daily_update`'s dependency on its own previous partition, so the
daemon runs the days strictly in order (a job backfill would not). Needs `dagster dev` (or a
webserver + daemon) running; it posts GraphQL `launchPartitionBackfill` and prints the id.

    python -m scripts.backfill_daily_rl 2025-11-03 2025-11-10 [--url http://localhost:3000] \
        [--config-json '{"ops": {"daily_update": {"config": {"max_new_tokens": 96}}}}']
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from datetime import date, timedelta

from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

# The whole daily_rl group: the loop, then its evaluation (pairs, baseline, outcomes, A/B, back-test), then the report.
ASSETS = (
    "headlines",
    "rollout_scores",
    "policy_checkpoint",
    "rollouts",
    "prompt_evolver",
    "rollout_pairs",
    "baseline_rollouts",
    "rollout_outcomes",
    "policy_eval",
    "backtest",
    "daily_report",
    "note_scorer",
)


def day_range(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    if end < start:
        raise SystemExit("the last day comes before the first")
    return [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def launch(
    first: str,
    last: str,
    url: str = "http://localhost:3000",
    run_config: dict | None = None,
    assets: tuple[str, ...] = ASSETS,
) -> dict:
    params = {
        "partitionNames": day_range(first, last),
        "assetSelection": [{"path": [name]} for name in assets],
        "title": f"daily_rl {first}..{last}",
    }
    if run_config:
        params["runConfigData"] = run_config
    body = json.dumps({"query": LAUNCH_PARTITION_BACKFILL_MUTATION, "variables": {"backfillParams": params}}).encode()
    request = urllib.request.Request(
        url.rstrip("/") + "/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    result = (answer.get("data") or {}).get("launchPartitionBackfill") or answer
    if result.get("__typename") != "LaunchBackfillSuccess":
        raise SystemExit(f"backfill not launched: {json.dumps(result)[:2000]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("last")
    parser.add_argument("--url", default="http://localhost:3000")
    parser.add_argument("--config-json", default=None, help="run config for every run of the backfill")
    args = parser.parse_args()
    result = launch(args.first, args.last, args.url, json.loads(args.config_json) if args.config_json else None)
    print(f"launched backfill {result['backfillId']}: watch it at {args.url}/overview/backfills/{result['backfillId']}")


if __name__ == "__main__":
    main()

"""Training status of the preference flywheel, as JSON.

    python -m scripts.flywheel_status [--min-new-pairs N]

Reads the warehouse under FLYWHEEL_DATA_DIR: n_preferences, n_dpo_pairs, n_holdout, new pairs since
the last adapter, ready_to_train with the blocking reasons, the last holdout evaluation and drift.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from outcome_flywheel.preferences.status import training_status
from outcome_flywheel.storage import Warehouse


def flywheel_status(warehouse: Warehouse | None = None, min_new_pairs: int | None = None) -> dict[str, Any]:
    return training_status(warehouse or Warehouse.from_env(), min_new_pairs)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-new-pairs", type=int, default=None, help="default FLYWHEEL_MIN_NEW_PAIRS (10)")
    args = parser.parse_args(argv)
    status = flywheel_status(min_new_pairs=args.min_new_pairs)
    print(json.dumps(status, indent=2, default=str))
    return status


if __name__ == "__main__":
    main()

"""The house holds its own shape: scripts/house.py's rules find nothing in the project, and each rule
fires on a small made-up project that breaks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.house import DAILY_RL_STAGES, MAX_LINES, MAX_MODULES, check, read_house, stage_order
from tests import PROJECT_ROOT

# A tiny project that keeps every rule: three stages of daily_rl in order, the recipe above them,
# partitions.py below, a resource reading the method.
CLEAN = {
    "outcome_flywheel/settings.py": "X = 1\n",
    "outcome_flywheel/storage.py": "class Warehouse:\n    pass\n\n\ndef atomic_write_bytes():\n    pass\n",
    "outcome_flywheel/daily_rl/partitions.py": "import datetime\n",
    "outcome_flywheel/daily_rl/feeds/source.py": "import json\n",
    "outcome_flywheel/daily_rl/reward/credit.py": "from outcome_flywheel.daily_rl.feeds import source\nfrom ..partitions import datetime\n",
    "outcome_flywheel/daily_rl/policy/gate.py": "from ..reward.credit import source\nfrom outcome_flywheel import settings\n",
    "outcome_flywheel/daily_rl/policy/step.py": "from outcome_flywheel.daily_rl import day\nfrom outcome_flywheel.storage import Warehouse\n",
    "outcome_flywheel/daily_rl/day.py": "from outcome_flywheel.daily_rl.policy import gate\n",
    "outcome_flywheel/daily_rl/day_store.py": "from outcome_flywheel.storage import Warehouse\n",
    "outcome_flywheel/daily_rl/feedback_join.py": "",
    "outcome_flywheel/feedback/ratings.py": "",
    "outcome_flywheel/cli.py": "import outcome_flywheel.daily_rl.day\nimport outcome_flywheel.feedback.ratings\n",
    "resources/models.py": "import dagster\nfrom outcome_flywheel.settings import X\n",
}


def project(root: Path, **changes: str) -> Path:
    """CLEAN with some files changed or added (a keyword is a path with `__` for `/`), every folder a package."""
    files = {**CLEAN, **{name.replace("__", "/") + ".py": text for name, text in changes.items()}}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.relative_to(root).parents:
            if folder != Path("."):
                (root / folder / "__init__.py").touch()
    return root


def one_problem(root: Path, *words: str) -> str:
    problems = check(root)
    assert len(problems) == 1, problems
    assert all(word in problems[0] for word in words), problems[0]
    return problems[0]


def test_the_project_holds_its_shape():
    assert check(PROJECT_ROOT) == []


def test_the_small_project_is_clean(tmp_path):
    assert check(project(tmp_path)) == []


def test_an_upward_import(tmp_path):
    root = project(tmp_path, outcome_flywheel__storage="def load():\n    from resources.models import X\n")
    one_problem(root, "outcome_flywheel/storage.py:2:", "(layer 1) imports resources.models (layer 2)")


def test_the_method_importing_dagster(tmp_path):
    root = project(tmp_path, outcome_flywheel__steps__entry="import dagster_pipes\nimport dagster\n")
    one_problem(root, "outcome_flywheel/steps/entry.py:2:", "the method imports dagster")


def test_areas_side_by_side(tmp_path):
    root = project(
        tmp_path,
        outcome_flywheel__daily_rl__feedback_join="from outcome_flywheel.feedback import ratings\n",  # declared
        outcome_flywheel__preferences__pairs="from outcome_flywheel.daily_rl.reward import credit\n",
    )
    one_problem(root, "outcome_flywheel/preferences/pairs.py:1:", "the preferences area imports the daily_rl area")
    root = project(tmp_path / "floor", outcome_flywheel__storage="import outcome_flywheel.feedback.ratings\n")
    one_problem(root, "outcome_flywheel.storage (ground floor) imports the feedback area")


def test_a_cycle_through_an_import_inside_a_function(tmp_path):
    root = project(
        tmp_path,
        outcome_flywheel__storage="from outcome_flywheel import json_rows\n",
        outcome_flywheel__json_rows="def rows():\n    from outcome_flywheel.storage import load\n",
    )
    problem = one_problem(root, "import cycle: outcome_flywheel.json_rows", "-> outcome_flywheel.storage")
    assert "outcome_flywheel/json_rows.py:2, in a function" in problem
    # under `if TYPE_CHECKING:` the import never runs: no cycle
    root = project(
        tmp_path / "typing",
        outcome_flywheel__storage="from outcome_flywheel import json_rows\n",
        outcome_flywheel__json_rows="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from outcome_flywheel import storage\n",
    )
    assert check(root) == []


def test_a_file_over_the_line_limit(tmp_path):
    assert check(project(tmp_path, outcome_flywheel__storage="x = 1\n" * MAX_LINES)) == []
    root = project(tmp_path / "long", outcome_flywheel__storage="x = 1\n" * (MAX_LINES + 1))
    one_problem(root, "outcome_flywheel/storage.py: 451 lines (over 450)")


def test_a_folder_with_too_many_modules(tmp_path):
    many = {f"outcome_flywheel__models__m{n}": "" for n in range(MAX_MODULES)}
    assert check(project(tmp_path, **many)) == []
    root = project(tmp_path / "more", **many, outcome_flywheel__models__one_more="")
    one_problem(root, "outcome_flywheel/models/: 16 modules in one folder (over 15)")


def test_a_stage_importing_a_stage_to_its_right(tmp_path):
    root = project(
        tmp_path,
        outcome_flywheel__daily_rl__report__summary="",
        outcome_flywheel__daily_rl__reward__signals="def f():\n    from ..report import summary\n",
    )
    problem = one_problem(root, "daily_rl/reward/signals.py:2: stage reward imports stage report, to its right")
    assert "(feeds < reward < policy < report)" in problem  # the order as it stands, stages that exist only


def test_below_and_above_the_stages(tmp_path):
    root = project(
        tmp_path, outcome_flywheel__daily_rl__partitions="from outcome_flywheel.daily_rl.feeds import source\n"
    )
    one_problem(root, "outcome_flywheel.daily_rl.partitions stands below every stage, yet imports")
    root = project(
        tmp_path / "recipe",
        outcome_flywheel__daily_rl__reward__ledger="from outcome_flywheel.daily_rl.day import gate\n",
    )
    one_problem(root, "stage reward imports the recipe module outcome_flywheel.daily_rl.day")


def test_a_stage_that_holds_the_warehouse(tmp_path):
    """Issue 48: a stage takes data and returns data; its step module and the recipe's store read and write, the
    report stage reads, and a stage may still write its own files atomically (storage's helpers)."""
    root = project(
        tmp_path,
        outcome_flywheel__daily_rl__reward__ledger="from outcome_flywheel.storage import Warehouse, atomic_write_bytes\n",
    )
    one_problem(root, "daily_rl/reward/ledger.py:1: stage reward imports the Warehouse")
    root = project(
        tmp_path / "fine",
        outcome_flywheel__daily_rl__reward__ledger="from outcome_flywheel.storage import atomic_write_bytes\n",
        outcome_flywheel__daily_rl__report__summary="def f():\n    from outcome_flywheel.storage import Warehouse\n",
    )
    assert check(root) == []


def test_a_stage_cycle_in_an_area_without_an_order(tmp_path):
    root = project(
        tmp_path,
        outcome_flywheel__preferences__pairs__build="from outcome_flywheel.preferences.weights import table\n",
        outcome_flywheel__preferences__weights__table="",
        outcome_flywheel__preferences__weights__fit="from outcome_flywheel.preferences.pairs import build\n",
    )
    one_problem(root, "stage cycle in preferences: pairs -> weights -> pairs")


def test_the_order_tolerates_a_stage_that_moved_out_and_names_one_it_lacks(tmp_path):
    house = read_house(project(tmp_path))  # no worlds/ (nor judge/, ...) here: nothing to say
    assert "worlds" in DAILY_RL_STAGES and stage_order(house) == []
    root = project(tmp_path / "new", outcome_flywheel__daily_rl__market__prices="")
    one_problem(root, "outcome_flywheel/daily_rl/market/: stage package market is not in DAILY_RL_STAGES")
    without_reward = tuple(s for s in DAILY_RL_STAGES if s != "reward")
    assert [p.split(": ", 1)[1] for p in stage_order(house, without_reward)] == [
        "stage package reward is not in DAILY_RL_STAGES; place it in the order"
    ]


def test_run_as_a_module(tmp_path):
    root = project(tmp_path, outcome_flywheel__storage="import pipelines.jobs\n")
    run = subprocess.run(
        [sys.executable, "-m", "scripts.house", str(root)], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines() == [
        "outcome_flywheel/storage.py:1: outcome_flywheel (layer 1) imports pipelines.jobs (layer 4)",
        f"house: 1 problem(s) in {len(read_house(root))} files",
    ]

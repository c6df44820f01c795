"""`make clean` and `make clean-prod`: remove what the project made, never under a running deployment,
and a PostgreSQL cluster only when asked by name.

    python -m deploy.clean [--prod] [--home DIR] [--project DIR]

Both refuse (exit 1), naming what runs, while any piece of `make up` runs (deploy.guard): `make up`
itself (its lock), a process one of its pid files names (checked as `make down` checks them), or a
PostgreSQL server on a cluster they would keep or remove. The homes looked at: --home,
FLYWHEEL_PROD_HOME and `.dagster-prod`. Whatever the home, any live process that uses what they would
remove refuses them too, found from the processes themselves (/proc): its folder, a FLYWHEEL_* or
DAGSTER_HOME path, or an open file there (a deployment started with another FLYWHEEL_PROD_HOME).

- `make clean`: `data/`, `.dagster/` and `.cache/` of the project, except the PostgreSQL clusters in
  `data/` (the production instance's run history and schedule state), which it names and keeps.
- `make clean-prod`, after `make down`: the production home (--home, else FLYWHEEL_PROD_HOME, else
  `.dagster-prod`), the cluster its deploy.json records, and the cluster the settings name now
  (FLYWHEEL_PG_DIR, else `<FLYWHEEL_DATA_DIR>/postgres`: a `make up` that failed after initdb leaves one
  with no record). Each path removed is printed. A folder that holds something other than a cluster is
  left alone.

Relative paths are taken from the project root. Only the standard library at import (deploy.processes,
with psutil, where it imports), so both run without the virtual environment, with a bare python3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from deploy import guard

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # as outcome_flywheel.settings has it, without importing it
DEFAULT_HOME = ".dagster-prod"
CLEANED = ("data", ".dagster", ".cache")


def _absolute(path: str | Path, project: Path) -> Path:
    path = Path(path).expanduser()
    return (path if path.is_absolute() else project / path).resolve()


def homes(project: Path, home: str | None) -> list[Path]:
    """The production homes to look at: the one named (--home), FLYWHEEL_PROD_HOME's and the default."""
    found = []
    for candidate in (home, os.environ.get("FLYWHEEL_PROD_HOME"), DEFAULT_HOME):
        if candidate:
            path = _absolute(candidate, project)
            if path not in found:
                found.append(path)
    return found


def running(home_dirs: list[Path], clusters: list[Path], removed: list[Path] = ()) -> list[str]:
    """One line per running piece: `make up`, a recorded process, a PostgreSQL server on one of
    `clusters`, and any other live process that uses what would be `removed` (found from the
    processes themselves: a deployment whose home is not among `home_dirs` has pid files not read here)."""
    pieces = [(home, piece) for home in home_dirs for piece in guard.live_pieces(home)]
    lines = [f"{piece}  (DAGSTER_HOME={home})" for home, piece in pieces]
    known = {piece.pid for _, piece in pieces}
    for cluster in clusters:
        pid = guard.cluster_server(cluster)
        if pid is not None:
            lines.append(str(guard.Running("PostgreSQL", pid, f"serving the cluster {cluster}")))
            known.add(pid)
    lines += [str(user) for user in guard.users_of([p for p in removed if p.exists()], known)]
    return lines


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _remove_all_but(path: Path, keep: set[Path], above_kept: set[Path]) -> None:
    """Remove `path` but the folders in `keep` (and the folders holding them)."""
    if path in keep:
        return
    if path not in above_kept:
        _remove(path)
        return
    for entry in path.iterdir():
        _remove_all_but(entry, keep, above_kept)


def _unsafe(path: Path, project: Path) -> bool:
    """A path no clean removes whole: the filesystem's root, the user's home, the project or a folder above it."""
    return path == Path(path.anchor) or path == Path.home().resolve() or path == project or path in project.parents


def clean(project: Path, home: str | None = None) -> tuple[int, list[str]]:
    """`make clean`: (exit status, lines to print)."""
    data = project / "data"
    kept = guard.find_clusters(data)
    busy = running(homes(project, home), kept, [project / name for name in CLEANED])
    if busy:
        return 1, refusal("make clean", busy)
    lines = []
    above_kept = {parent for cluster in kept for parent in cluster.parents if parent == data or data in parent.parents}
    for name in CLEANED:
        path = project / name
        if not (path.exists() or path.is_symlink()):
            continue
        if path == data and kept:
            if data not in kept:
                _remove_all_but(data, set(kept), above_kept)
                lines.append(f"removed {data}, but for the PostgreSQL cluster(s) below")
        else:
            _remove(path)
            lines.append(f"removed {path}")
    lines += [
        f"kept {cluster}: a PostgreSQL cluster (a production instance's run history and schedule state); "
        "`make down`, then `make clean-prod` removes it"
        for cluster in kept
    ]
    return 0, lines or ["nothing to remove"]


def current_pg_dir(project: Path) -> Path:
    """The cluster folder the settings name now, as deploy.settings resolves it."""
    explicit = os.environ.get("FLYWHEEL_PG_DIR")
    if explicit:
        return _absolute(explicit, project)
    return _absolute(os.environ.get("FLYWHEEL_DATA_DIR") or "data", project) / "postgres"


def clean_prod(project: Path, home: str | None = None) -> tuple[int, list[str]]:
    """`make clean-prod`: (exit status, lines to print)."""
    home_dirs = homes(project, home)
    target = home_dirs[0]  # --home, else FLYWHEEL_PROD_HOME, else the default
    saved = guard.recorded(target).get("pg_dir")
    clusters, lines = [], []
    for folder in ([_absolute(saved, project)] if saved else []) + [current_pg_dir(project)]:
        if folder in clusters or not folder.exists():
            continue
        if guard.is_cluster(folder) or (folder.is_dir() and not any(folder.iterdir())):
            clusters.append(folder)
        else:
            lines.append(f"left {folder}: not a PostgreSQL cluster")
    busy = running(home_dirs, clusters, [*clusters, target])
    if busy:
        return 1, refusal("make clean-prod", busy)
    for path, what in [(c, "the PostgreSQL cluster") for c in clusters] + [(target, "the production home")]:
        if not path.exists():
            continue
        if _unsafe(path, project):
            lines.append(f"left {path}: it is not removed whole")
            continue
        _remove(path)
        lines.append(f"removed {path} ({what})")
    return 0, lines or [f"nothing to remove (no {target}, no cluster)"]


def refusal(command: str, busy: list[str]) -> list[str]:
    return (
        [
            f"refused: a production deployment is running (`make up`), or a process, that uses what {command} would remove:"
        ]
        + [f"  {line}" for line in busy]
        + [
            "Stop it first with `make down` (with FLYWHEEL_PROD_HOME set as for its `make up`), or wait for `make up` to finish; "
            "stop any other process named."
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make clean",
        description="Remove data/, .dagster/ and .cache/ but a PostgreSQL cluster "
        "(--prod: the production home and its cluster), never while `make up` runs.",
    )
    p.add_argument(
        "--prod", action="store_true", help="`make clean-prod`: the production home and its PostgreSQL cluster"
    )
    p.add_argument("--home", help="the production DAGSTER_HOME (FLYWHEEL_PROD_HOME; default .dagster-prod)")
    p.add_argument("--project", default=str(PROJECT_ROOT), help="the project root (default: this checkout)")
    args = p.parse_args(argv)
    project = Path(args.project).resolve()
    command = "make clean-prod" if args.prod else "make clean"
    try:
        status, lines = (clean_prod if args.prod else clean)(project, args.home)
    except OSError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return 1
    print(
        "\n".join(f"{command}: {line}" if not line.startswith("  ") else line for line in lines),
        file=sys.stderr if status else sys.stdout,
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())

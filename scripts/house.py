"""The house's rules: the shape docs/architecture.md describes, checked over the code itself.

    python -m scripts.house [ROOT]     one problem a line, then a count; exit status 1 when there is one

Every module of outcome_flywheel/, resources/, assets/ and pipelines/ is read (service/, scripts/,
benchmarks/ and tests/ stand above the four layers and are not checked). The rules:

- layers: an import points to its own layer or one below (LAYERS, lowest first), never above;
- the method is plain Python: outcome_flywheel/ never imports Dagster (DAGSTER);
- areas: daily_rl, preferences and feedback stand side by side and do not import each other, except
  the uses declared in AREA_USES; the ground floor beside them (settings, storage, models/, ...)
  imports no area; only cli.py, the console script, stands above them (ABOVE_AREAS);
- size: no file over MAX_LINES lines, no package folder with more than MAX_MODULES modules of its own;
- cycles: no import cycle between modules, imports inside functions included (an import under
  `if TYPE_CHECKING:` never runs, so it does not count); inside an area, no cycle between its stage
  packages (area/<stage>/);
- daily_rl's stage order (DAILY_RL_STAGES): a stage imports only stages listed before it; the modules
  at the top of daily_rl/ that are not the recipe (partitions.py, ...) stand below every stage and
  import none; only the recipe modules (daily_rl/day*.py) import any stage they run. A stage package
  missing from the list is reported; a listed stage with no package is simply skipped.
- stage I/O: a daily_rl stage module does not import the Warehouse; the recipe's store and each stage's
  step module (<stage>/step.py) read and write, the reading stages (READERS: report) read.

tests/test_house.py runs the rules on the project (no problem allowed) and on small made-up projects.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

LAYERS = {"outcome_flywheel": 1, "resources": 2, "assets": 3, "pipelines": 4}
# Dagster's packages the method may not import; dagster_pipes, the small client a step process
# reports through (outcome_flywheel/steps/), is not among them.
DAGSTER = ("dagster", "dagster_webserver", "dagster_graphql")
AREAS = ("daily_rl", "preferences", "feedback")
AREA_USES = {("daily_rl", "feedback")}  # (reader, read): people's ratings join the daily reward
ABOVE_AREAS = ("outcome_flywheel.cli",)
MAX_LINES = 450
MAX_MODULES = 15

# daily_rl's stage packages, lowest first: a stage imports only stages listed before it. The same
# order as docs/architecture.md's `feeds, notes, judge, worlds -> reward -> ...`, read left to right.
DAILY_RL_STAGES = (
    "feeds",
    "notes",
    "judge",
    "worlds",
    "reward",
    "policy",
    "note_scorer",
    "evaluation",
    "distillation",
    "report",
)
RECIPE = "day"  # daily_rl/day*.py: the recipe, above every stage
# The warehouse handle; a stage's module may not import it: the recipe's store (day_store.py) and each
# stage's step module read at the start and write at the end, and the stages take data and return data.
WAREHOUSE = ("outcome_flywheel.storage", "Warehouse")
READERS = ("report",)  # stages whose job is to read the warehouse: the demo's and the status page's summaries
# A stage's Pipes step module (<stage>/step.py) runs it as its own process, like the recipe's
# day_step.py, and may use the recipe's record helpers.
STEP = "step"


@dataclass(frozen=True)
class Import:
    line: int
    target: str  # the project module imported (resolved), or the outside name as written
    runs: bool  # False under `if TYPE_CHECKING:`
    in_function: bool  # runs when the function is called, not on import
    name: str = ""  # `from X import name`: the name imported ("" for `import X`)


@dataclass
class Module:
    name: str  # dotted, e.g. outcome_flywheel.daily_rl.reward.credit
    path: str  # relative to the root, e.g. outcome_flywheel/daily_rl/reward/credit.py
    lines: int
    package: bool  # an __init__.py
    imports: list[Import] = field(default_factory=list)

    @property
    def parts(self) -> list[str]:
        return self.name.split(".")


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_house(root: Path) -> dict[str, Module]:
    """Every module of the four layers, with its imports resolved to project modules where they are one."""
    paths = sorted(p for top in LAYERS if (root / top).is_dir() for p in (root / top).rglob("*.py"))
    trees, house = {}, {}
    for path in paths:
        relative = path.relative_to(root)
        text = path.read_text(encoding="utf-8")
        module = Module(module_name(relative), relative.as_posix(), len(text.splitlines()), path.name == "__init__.py")
        house[module.name] = module
        trees[module.name] = ast.parse(text, filename=str(path))
    for name, tree in trees.items():
        house[name].imports = list(_imports(tree, house[name], house))
    return house


def _imports(tree: ast.Module, module: Module, house: dict[str, Module]):
    type_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for child in node.body for n in ast.walk(child))
    in_function = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in node.body
        for n in ast.walk(child)
    }
    package = module.parts if module.package else module.parts[:-1]
    for node in ast.walk(tree):
        runs, late = id(node) not in type_only, id(node) in in_function
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, _resolve(alias.name, house), runs, late)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from pkg import module` imports the module
                wanted = f"{base}.{alias.name}"
                target = wanted if wanted in house else _resolve(base, house)
                yield Import(node.lineno, target, runs, late, alias.name)


def _resolve(name: str, house: dict[str, Module]) -> str:
    """The project module an import name lands in (its longest known prefix), or the name itself."""
    probe = name
    while probe and probe not in house:
        probe = probe.rpartition(".")[0]
    return probe or name


def _layer(name: str) -> int | None:
    return LAYERS.get(name.split(".")[0])


def _area(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "outcome_flywheel" and len(parts) > 1 and parts[1] in AREAS else None


# ---------------------------------------------------------------------------------------- the rules


def layers(house: dict[str, Module]) -> list[str]:
    out = []
    for m in house.values():
        mine = _layer(m.name)
        for i in m.imports:
            theirs = _layer(i.target)
            if theirs is not None and theirs > mine:
                out.append(f"{m.path}:{i.line}: {m.parts[0]} (layer {mine}) imports {i.target} (layer {theirs})")
    return out


def no_dagster_in_the_method(house: dict[str, Module]) -> list[str]:
    return [
        f"{m.path}:{i.line}: the method imports {i.target}"
        for m in house.values()
        if m.parts[0] == "outcome_flywheel"
        for i in m.imports
        if i.target.split(".")[0] in DAGSTER
    ]


def areas(house: dict[str, Module]) -> list[str]:
    out = []
    for m in house.values():
        if m.parts[0] != "outcome_flywheel" or m.name in ABOVE_AREAS:
            continue
        mine = _area(m.name)
        for i in m.imports:
            theirs = _area(i.target)
            if theirs and theirs != mine and (mine, theirs) not in AREA_USES:
                who = f"the {mine} area" if mine else f"{m.name} (ground floor)"
                out.append(
                    f"{m.path}:{i.line}: {who} imports the {theirs} area ({i.target}); move what they share below"
                )
    return out


def sizes(house: dict[str, Module]) -> list[str]:
    out = [f"{m.path}: {m.lines} lines (over {MAX_LINES})" for m in house.values() if m.lines > MAX_LINES]
    folders: dict[str, int] = {}
    for m in house.values():
        folder = m.path.rpartition("/")[0]
        folders[folder] = folders.get(folder, 0) + (not m.package)
    for folder, count in sorted(folders.items()):
        if count > MAX_MODULES:
            out.append(f"{folder}/: {count} modules in one folder (over {MAX_MODULES}): group them into packages")
    return out


def cycles(house: dict[str, Module]) -> list[str]:
    """Import cycles between modules; an import inside a function counts (it runs when called)."""
    edges = {m.name: {i.target for i in m.imports if i.runs and i.target in house} - {m.name} for m in house.values()}
    out = []
    for loop in find_cycles(edges):
        steps = []
        for a, b in zip(loop, loop[1:]):
            i = next(i for i in house[a].imports if i.runs and i.target == b)
            steps.append(f"{a} ({house[a].path}:{i.line}{', in a function' if i.in_function else ''})")
        out.append("import cycle: " + " -> ".join(steps + [loop[-1]]))
    return out


def _stages(house: dict[str, Module], area: str) -> set[str]:
    """The stage packages of an area: its sub-packages, outcome_flywheel/<area>/<stage>/."""
    prefix = ["outcome_flywheel", area]
    return {
        m.parts[2]
        for m in house.values()
        if m.parts[:2] == prefix and (len(m.parts) > 3 or (len(m.parts) == 3 and m.package))
    }


def stage_cycles(house: dict[str, Module]) -> list[str]:
    out = []
    for area in AREAS:
        stages = _stages(house, area)
        edges: dict[str, set[str]] = {s: set() for s in stages}
        for m in house.values():
            mine = _stage_of(m.name, area, stages)
            for i in m.imports if mine else ():
                theirs = _stage_of(i.target, area, stages)
                if i.runs and theirs and theirs != mine:
                    edges[mine].add(theirs)
        out += [f"stage cycle in {area}: " + " -> ".join(loop) for loop in find_cycles(edges)]
    return out


def _stage_of(name: str, area: str, stages: set[str]) -> str | None:
    parts = name.split(".")
    if parts[:2] == ["outcome_flywheel", area] and len(parts) > 2 and parts[2] in stages:
        return parts[2]
    return None


def stage_order(house: dict[str, Module], order: tuple[str, ...] = DAILY_RL_STAGES) -> list[str]:
    """daily_rl: stages import only stages listed before them; the top modules other than the recipe stand
    below every stage; only the recipe modules (day*.py) import stages freely."""
    area = "daily_rl"
    stages = _stages(house, area)
    out = [
        f"outcome_flywheel/{area}/{s}/: stage package {s} is not in DAILY_RL_STAGES; place it in the order"
        for s in sorted(stages - set(order))
    ]
    rank = {s: n for n, s in enumerate(order)}
    listed = " < ".join(s for s in order if s in stages)

    def recipe(name: str) -> bool:
        parts = name.split(".")
        return parts[:2] == ["outcome_flywheel", area] and len(parts) == 3 and parts[2].startswith(RECIPE)

    for m in house.values():
        if m.parts[:2] != ["outcome_flywheel", area] or recipe(m.name):
            continue
        mine = _stage_of(m.name, area, stages)
        for i in m.imports:
            theirs = _stage_of(i.target, area, stages)
            where = f"{m.path}:{i.line}"
            if mine is None and (theirs or recipe(i.target)):  # partitions.py and the like
                out.append(f"{where}: {m.name} stands below every stage, yet imports {i.target}")
            elif theirs and theirs != mine and mine in rank and theirs in rank and rank[theirs] > rank[mine]:
                out.append(f"{where}: stage {mine} imports stage {theirs}, to its right in the order ({listed})")
            elif recipe(i.target) and m.parts[-1] != STEP:
                out.append(f"{where}: stage {mine} imports the recipe module {i.target}; the recipe stands above")
    return out


def stage_io(house: dict[str, Module]) -> list[str]:
    """daily_rl: a stage module takes data and returns data; only the recipe, the step modules and the
    reading stages (READERS) hold the warehouse."""
    area = "daily_rl"
    stages = _stages(house, area)
    out = []
    for m in house.values():
        mine = _stage_of(m.name, area, stages)
        if mine is None or mine in READERS or m.parts[-1] == STEP:
            continue
        for i in m.imports:
            if (i.target, i.name) == WAREHOUSE:
                out.append(
                    f"{m.path}:{i.line}: stage {mine} imports the Warehouse; a stage takes data and returns data "
                    f"(its step module, {area}/{mine}/{STEP}.py, or the recipe's store reads and writes)"
                )
    return out


RULES = (layers, no_dagster_in_the_method, areas, sizes, cycles, stage_cycles, stage_order, stage_io)


def check(root: Path) -> list[str]:
    """Every problem the rules find in the project at root (an empty list: the house holds its shape)."""
    root = Path(root)
    if not (root / "outcome_flywheel").is_dir():
        return [f"{root}: no outcome_flywheel/ package, the method has no Dagster-free home"]
    house = read_house(root)
    return [problem for rule in RULES for problem in rule(house)]


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of the graph, as a path that returns to its first node
    (Tarjan's algorithm, then the shortest way back round from the group's first member)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 1000))
    try:
        for v in sorted(edges):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    out = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        came: dict[str, str] = {}
        frontier = [start]
        while start not in came:  # breadth first, inside the group, back to the start
            step = []
            for v in frontier:
                for w in sorted(edges.get(v, ())):
                    if w in members and w not in came:
                        came[w] = v
                        step.append(w)
            frontier = step
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(came[path[-1]])
        out.append(path[::-1])
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else ".").resolve()
    problems = check(root)
    for problem in problems:
        print(problem)
    files = len(read_house(root)) if (root / "outcome_flywheel").is_dir() else 0
    print(f"house: {len(problems)} problem(s) in {files} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Follow one handle (a model loader, a warehouse) through the calls from one function, read from the
source alone (ast; nothing of the project is imported), and count how far a reader has to go.

    python -m scripts.walk_calls MODULE:FUNCTION HANDLE [--show] [--root DIR]
    python -m scripts.walk_calls outcome_flywheel.daily_rl.day:run_daily_update models --show
    python -m scripts.walk_calls outcome_flywheel.daily_rl.day:run_daily_update store.warehouse

The entry is `module:function` or `module:Class.method`, read under --root (default: the current folder).
HANDLE is a parameter or variable of the entry (`models`), or an attribute chain on one (`store.warehouse`:
the warehouse the store holds).

The rules:
- The walk reads the entry's body and, in source order (outer call before the calls in its arguments),
  every call in it; lambdas and functions nested in a function are part of it.
- The handle is tracked as a set of expressions: the start, plus aliases of the handle itself
  (`wh = self.warehouse`; `prev = inputs.prev_rollouts` on a tracked `inputs` is no alias, it is a part),
  plus the attribute under which an object built from the handle keeps it (`store = DayStore(warehouse)`
  whose `__init__` does `self.warehouse = warehouse` makes `store.warehouse` tracked). An expression that
  a tracked one starts with (`store` of `store.warehouse`, `self` of `self.warehouse`) is its holder.
- A call is a STOP when its receiver is the handle or its holder (`models.load()`, `self.warehouse.read()`,
  `store.read()` while tracking `store.warehouse`), or when one of its arguments (positional, starred or
  keyword) is the handle, its holder, or an attribute chain rooted at the handle (`store.open(.., models.seed)`).
  A receiver that is only a part of the handle (`store.checkpoints.publish()` while tracking `store`) and
  an argument that merely contains the handle (`f(g(models))`: `g(models)` is the stop) are not.
- Each stop's callee is resolved to a project function where it can be: a name defined in the module or
  imported with `from X import f` (re-exports followed), `module.f`, a class (its `__init__`, inherited ones
  too), or a method looked up (through the bases) on the receiver's class. The receiver's class comes from
  the current function's annotations (`store: DayStore`, `X | None` too), a constructor assignment
  (`x = X(..)`, `with X(..) as x`, `self.x = X(..)`), an attribute annotated on the class or assigned from
  an annotated `__init__` parameter (`self.warehouse = warehouse` with `warehouse: Warehouse`), an alias, or
  the type the caller knew for the argument. Functions outside --root (dagster, pandas, torch, builtins)
  stay unresolved.
- The walk then enters the resolved callee, tracking there what received the handle: the parameter the
  handle (or its holder) was bound to, `self` for a method called on the handle, `self.<attr>` for a
  method called on its holder. A part of the handle passed as an argument (`models.seed`) is counted and
  not followed. Every call site counts as a stop; a callee is entered only the first time it is reached
  with the same tracked expressions (so a cycle or a repeated helper is read once).
- A stop's file is its resolved callee's file, else the file the call is written in. `files` counts the
  distinct ones; `returns` counts, along the stops in walk order (depth first: a callee's stops come
  right after the stop that entered it), each arrival at a file the walk had been in before and left.

Printed: with --show, each stop as an indented tree (call site file:line, the call, its resolved callee);
then the files most returned to; last, one JSON line {entry, handle, stops, files, returns}.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


def dotted(node) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def rooted(expr: str, prefix: str) -> str | None:
    """The rest of `expr` after `prefix` ('' when equal, '.x' when below it), or None when not under it."""
    if expr == prefix:
        return ""
    return expr[len(prefix) :] if expr.startswith(prefix + ".") else None


@dataclass
class Module:
    name: str
    path: Path
    rel: str
    tree: ast.Module
    defs: dict = field(default_factory=dict)  # name -> FunctionDef / ClassDef at the top level
    imports: dict = field(default_factory=dict)  # local name -> (module, name or None for a module)


@dataclass(frozen=True)
class ClassRef:
    module: Module
    node: ast.ClassDef


@dataclass(frozen=True)
class FuncRef:
    module: Module
    node: ast.FunctionDef
    cls: ClassRef | None = None

    @property
    def qualname(self) -> str:
        return f"{self.cls.node.name}.{self.node.name}" if self.cls else self.node.name

    def decorated(self, name: str) -> bool:
        return any(dotted(d) == name for d in self.node.decorator_list)


class Project:
    """The modules under `root`, parsed on demand, and what their names refer to."""

    def __init__(self, root: Path):
        self.root, self._modules, self._asking = root.resolve(), {}, set()

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            base = self.root.joinpath(*name.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            self._modules[name] = self._parse(name, path) if path else None
        return self._modules[name]

    def _parse(self, name: str, path: Path) -> Module:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        mod = Module(name, path, path.relative_to(self.root).as_posix(), tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):  # imports inside functions and under TYPE_CHECKING too
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    source = f"{base}.{source}" if source else base
                for a in node.names:
                    mod.imports[a.asname or a.name] = (source, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".")[0]
                    mod.imports[local] = (a.name if a.asname else local, None)
        for node in tree.body:
            if isinstance(node, (*FUNC, ast.ClassDef)):
                mod.defs[node.name] = node
        return mod

    def resolve(self, mod: Module, name: str, depth: int = 0):
        """What `name` means in `mod`: a FuncRef, ClassRef, Module, or None (outside the project)."""
        if depth > 20:
            return None
        node = mod.defs.get(name)
        if isinstance(node, ast.ClassDef):
            return ClassRef(mod, node)
        if node is not None:
            return FuncRef(mod, node)
        if name not in mod.imports:
            return None
        source, attr = mod.imports[name]
        if attr is None:
            return self.module(source)
        target = self.module(source)
        found = self.resolve(target, attr, depth + 1) if target else None
        return found or self.module(f"{source}.{attr}")

    def resolve_dotted(self, mod: Module, expr: str):
        head, *rest = expr.split(".")
        ref = self.resolve(mod, head)
        for part in rest:
            if isinstance(ref, Module):
                ref = self.resolve(ref, part) or self.module(f"{ref.name}.{part}")
            else:
                return None
        return ref

    def annotation(self, mod: Module, node) -> ClassRef | None:
        """The project class an annotation names (`X`, `m.X`, `"X"`, `X | None`, `Optional[X]`)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.annotation(mod, node.left) or self.annotation(mod, node.right)
        if isinstance(node, ast.Subscript) and dotted(node.value) in ("Optional", "typing.Optional"):
            return self.annotation(mod, node.slice)
        ref = self.resolve_dotted(mod, dotted(node)) if dotted(node) else None
        return ref if isinstance(ref, ClassRef) else None

    def bases(self, cls: ClassRef) -> list[ClassRef]:
        out = []
        for b in cls.node.bases:
            ref = self.resolve_dotted(cls.module, dotted(b)) if dotted(b) else None
            if isinstance(ref, ClassRef):
                out.append(ref)
        return out

    def method(self, cls: ClassRef, name: str, depth: int = 0) -> FuncRef | None:
        for node in cls.node.body:
            if isinstance(node, FUNC) and node.name == name:
                return FuncRef(cls.module, node, cls)
        for base in self.bases(cls) if depth < 20 else []:
            if found := self.method(base, name, depth + 1):
                return found
        return None

    def attribute(self, cls: ClassRef, attr: str, depth: int = 0) -> ClassRef | None:
        """The class of `instance.attr`: a class-level annotation, a property's return annotation, or
        `self.attr = X(..)` / `self.attr = param` (annotated) in one of its methods."""
        for node in cls.node.body:
            if isinstance(node, ast.AnnAssign) and dotted(node.target) == attr:
                return self.annotation(cls.module, node.annotation)
            if isinstance(node, FUNC) and node.name == attr and node.returns is not None:
                return self.annotation(cls.module, node.returns)
        key = (cls.module.name, cls.node.name, attr)
        if key in self._asking:  # `self.a = self.b`, `self.b = self.a`
            return None
        self._asking.add(key)
        try:
            for node in cls.node.body:
                if isinstance(node, FUNC):
                    scope = Scope(self, FuncRef(cls.module, node, cls), {})
                    if (ann := scope.annotated.get(f"{scope.self_name}.{attr}")) is not None:
                        return self.annotation(cls.module, ann)
                    for target, value in scope.assigns:
                        if target == f"{scope.self_name}.{attr}" and (found := scope.type_of_value(value)):
                            return found
            for base in self.bases(cls) if depth < 20 else []:
                if found := self.attribute(base, attr, depth + 1):
                    return found
            return None
        finally:
            self._asking.discard(key)


def assignments(func) -> list[tuple[str, object]]:
    """(target, value) of every simple assignment in a function, tuples unpacked pairwise, `with X as y`."""
    out = []

    def pair(target, value):
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                pair(t, v)
        elif dotted(target):
            out.append((dotted(target), value))

    for node in (n for stmt in func.body for n in ast.walk(stmt)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pair(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pair(node.target, node.value)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    pair(item.optional_vars, item.context_expr)
    return out


class Scope:
    """One function as the walk reads it: its parameters, assignments and the types it knows."""

    def __init__(self, project: Project, func: FuncRef, known: dict):
        self.project, self.func, self.known = project, func, known
        args = func.node.args
        self.params = [*args.posonlyargs, *args.args]
        self.all_params = {a.arg: a for a in [*self.params, *args.kwonlyargs]}
        is_method = func.cls is not None and not func.decorated("staticmethod")
        self.self_name = self.params[0].arg if is_method and self.params else None
        self.assigns = assignments(func.node)
        self.annotated = {
            dotted(n.target): n.annotation
            for stmt in func.node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.AnnAssign) and dotted(n.target)
        }

    def type_of_value(self, value, depth: int = 1) -> ClassRef | None:
        """The class of an assigned value: a constructor's, an alias's, a project function's return annotation."""
        if isinstance(value, ast.Call) and depth < 5:
            ref = self.project.resolve_dotted(self.func.module, dotted(value.func)) if dotted(value.func) else None
            if isinstance(ref, ClassRef):
                return ref
            callee, _ = self.callee(value, depth + 1)
            if isinstance(callee, FuncRef) and callee.node.name != "__init__" and callee.node.returns is not None:
                return self.project.annotation(callee.module, callee.node.returns)
            return None
        return self.type_of(dotted(value), depth) if dotted(value) else None

    def type_of(self, expr: str, depth: int = 0) -> ClassRef | None:
        head, *rest = expr.split(".")
        cls = None
        if expr in self.annotated:
            return self.project.annotation(self.func.module, self.annotated[expr])
        if head in self.known:
            cls = self.known[head]
        elif head == self.self_name:
            cls = self.func.cls
        elif head in self.annotated:
            cls = self.project.annotation(self.func.module, self.annotated[head])
        elif head in self.all_params and self.all_params[head].annotation is not None:
            cls = self.project.annotation(self.func.module, self.all_params[head].annotation)
        elif depth < 5:
            for target, value in self.assigns:
                if target == head and (cls := self.type_of_value(value, depth + 1)):
                    break
        for attr in rest:
            cls = self.project.attribute(cls, attr) if cls else None
        return cls

    def callee(self, call: ast.Call, depth: int = 0) -> tuple[object, bool]:
        """(the project function called, a class without `__init__`, or None; whether the call binds its first
        parameter: a method called on an instance, a constructor, a classmethod)."""
        func, project = call.func, self.project
        if isinstance(func, ast.Name):
            ref = project.resolve(self.func.module, func.id)
        elif isinstance(func, ast.Attribute) and dotted(func.value):
            value = dotted(func.value)
            owner = (
                project.resolve_dotted(self.func.module, value) if value.split(".")[0] not in self.local_names else None
            )
            if isinstance(owner, Module):
                ref = project.resolve(owner, func.attr)
            elif isinstance(owner, ClassRef):  # Class.method(...): bound only for a classmethod
                found = project.method(owner, func.attr)
                return found, bool(found and found.decorated("classmethod"))
            else:
                cls = self.type_of(value, depth)
                found = project.method(cls, func.attr) if cls else None
                return found, bool(found and not found.decorated("staticmethod"))
        else:
            return None, False
        if isinstance(ref, ClassRef):
            return (project.method(ref, "__init__") or ref), True
        return (ref if isinstance(ref, FuncRef) else None), False

    @property
    def local_names(self) -> set[str]:
        return set(self.all_params) | {t for t, _ in self.assigns if "." not in t}


@dataclass
class Stop:
    depth: int
    site: str  # file:line of the call
    call: str
    callee: str | None
    file: str  # the callee's file, else the call's


class Walk:
    def __init__(self, project: Project):
        self.project, self.stops, self.entered = project, [], set()

    def run(self, func: FuncRef, tracked: set[str], known: dict, depth: int = 0) -> None:
        key = (func.module.name, func.qualname, frozenset(tracked))
        if key in self.entered or depth > 200:
            return
        self.entered.add(key)
        scope = Scope(self.project, func, known)
        tracked = self.grow(scope, set(tracked))
        calls = [n for stmt in func.node.body for n in ast.walk(stmt) if isinstance(n, ast.Call)]
        calls.sort(key=lambda c: (c.lineno, c.col_offset, -(c.end_lineno or 0), -(c.end_col_offset or 0)))
        for call in calls:
            receiver = dotted(call.func.value) if isinstance(call.func, ast.Attribute) else None
            on_handle = receiver is not None and self.holds(receiver, tracked)
            args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
            args += [k.value for k in call.keywords]
            passed = [a for a in args if dotted(a) and self.touches(dotted(a), tracked)]
            if not on_handle and not passed:
                continue
            callee, bound = scope.callee(call)
            site = f"{func.module.rel}:{call.lineno}"
            name = None if callee is None else f"{callee.module.name}.{callee.node.name}"
            if isinstance(callee, FuncRef):
                name = f"{callee.module.name}.{callee.qualname}"
            file = callee.module.rel if callee is not None else func.module.rel
            self.stops.append(Stop(depth, site, ast.unparse(call.func), name, file))
            if isinstance(callee, FuncRef):
                inner, inner_known = self.bind(scope, call, callee, bound, receiver, tracked)
                if inner:
                    self.run(callee, inner, inner_known, depth + 1)

    @staticmethod
    def holds(expr: str, tracked: set[str]) -> bool:
        """`expr` is the handle or its holder."""
        return any(rooted(t, expr) is not None for t in tracked)

    def touches(self, expr: str, tracked: set[str]) -> bool:
        """`expr` is the handle, its holder, or a part of the handle."""
        return self.holds(expr, tracked) or any(rooted(expr, t) is not None for t in tracked)

    def grow(self, scope: Scope, tracked: set[str]) -> set[str]:
        """Add the aliases of the handle, and where an object built from it keeps it."""
        changed = True
        while changed:
            changed = False
            for target, value in scope.assigns:
                new = set()
                if dotted(value):
                    new = {target + rest for t in tracked if (rest := rooted(t, dotted(value))) is not None}
                elif isinstance(value, ast.Call):
                    new = {target + p[len("self") :] for p in self.kept(scope, value, tracked)}
                if not new <= tracked:
                    tracked |= new
                    changed = True
        return tracked

    def kept(self, scope: Scope, call: ast.Call, tracked: set[str]) -> set[str]:
        """`self.<attr>...` under which a constructor called with the handle keeps it."""
        callee, bound = scope.callee(call)
        if not isinstance(callee, FuncRef) or callee.node.name != "__init__" or not bound:
            return set()
        inner, _ = self.bind(scope, call, callee, bound, None, tracked)
        init = Scope(self.project, callee, {})
        out = set()
        for target, value in init.assigns:
            if init.self_name and target.startswith(init.self_name + ".") and dotted(value):
                for t in inner:
                    if (rest := rooted(t, dotted(value))) is not None:
                        out.add("self" + target[len(init.self_name) :] + rest)
        return out

    def bind(self, scope, call, callee: FuncRef, bound: bool, receiver, tracked) -> tuple[set[str], dict]:
        """What the callee tracks (the parameters that received the handle or its holder) and their types."""
        callee_scope = Scope(self.project, callee, {})
        params = [p.arg for p in callee_scope.params]
        inner, known = set(), {}

        def take(param: str, expr: str):
            inner.update(param + rest for t in tracked if (rest := rooted(t, expr)) is not None)
            if param not in known and (cls := scope.type_of(expr)) is not None:
                known[param] = cls  # what the caller knew of the argument, tracked or not

        if bound and params:
            if receiver is not None:
                take(params[0], receiver)
            params = params[1:]
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                break
            if i < len(params) and dotted(arg):
                take(params[i], dotted(arg))
        for kw in call.keywords:
            if kw.arg in callee_scope.all_params and dotted(kw.value):
                take(kw.arg, dotted(kw.value))
        return inner, known


def walk(root: Path, entry: str, handle: str) -> tuple[list[Stop], dict]:
    project = Project(root)
    module_name, _, qualname = entry.partition(":")
    module = project.module(module_name)
    if module is None:
        raise SystemExit(f"no module {module_name} under {root}")
    head, _, method = qualname.partition(".")
    ref = project.resolve(module, head)
    if method and isinstance(ref, ClassRef):
        ref = project.method(ref, method)
    if not isinstance(ref, FuncRef):
        raise SystemExit(f"no function {qualname} in {module_name}")
    w = Walk(project)
    w.run(ref, {handle}, {})
    return w.stops, summary(entry, handle, w.stops)


def summary(entry: str, handle: str, stops: list[Stop]) -> dict:
    seen, last, returns = set(), None, Counter()
    for stop in stops:
        if stop.file != last and stop.file in seen:
            returns[stop.file] += 1
        seen.add(stop.file)
        last = stop.file
    figures = {"entry": entry, "handle": handle, "stops": len(stops), "files": len(seen)}
    return {**figures, "returns": sum(returns.values()), "by_file": dict(returns.most_common())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", help="module:function or module:Class.method")
    parser.add_argument("handle", help="a parameter or variable of the entry, or an attribute chain on one")
    parser.add_argument("--show", action="store_true", help="print each stop as an indented tree")
    parser.add_argument("--root", type=Path, default=Path("."), help="the project's folder (default: here)")
    args = parser.parse_args(argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    stops, figures = walk(args.root, args.entry, args.handle)
    if args.show:
        for s in stops:
            print(f"{'  ' * s.depth}{s.site}  {s.call}(..)  -> {s.callee or '?'}")
    by_file = figures.pop("by_file")
    print("returns by file: " + (", ".join(f"{f} {n}x" for f, n in by_file.items()) or "none"))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

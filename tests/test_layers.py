"""The package's shape: layers depend one way and no module imports itself round a cycle.

The import graph is read from the source (every `import`, function-level ones too), so a lazy
import cannot hide a cycle or a dependency that points up a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "llamaspec"

# layer -> the layers it may import (errors.py, _version.py and knobs.py, the table of sampling and
# drafting settings that every layer reads, sit below all; cli and the public API,
# llamaspec/__init__.py, on top)
ALLOWED = {
    "errors": set(),
    "gguf": {"errors"},
    "hub": {"errors", "gguf"},
    "pairing": {"errors", "gguf", "hub"},
    "runtime": {"errors", "gguf"},
    "speculative": {"errors", "gguf", "runtime"},
    # OpenAI's wire format (llamaspec/openai/: request fields, response objects, tools), shared by
    # batch, serve and the API; runtime for the grammars (runtime/grammar.py) its fields compile to
    "format": {"errors", "runtime"},
    "batch": {"errors", "format"},
    # batch --ray's executor (batch/ray_executor.py): Generators on Ray actors, so above the API
    "batch_ray": {"errors", "api"},
    # measurement sits above the engine; tune sweeps with bench's runner
    "bench": {"errors", "gguf", "runtime", "speculative"},
    "tune": {"errors", "gguf", "hub", "pairing", "runtime", "speculative", "bench"},
    "cli": {"errors", "gguf", "hub", "pairing", "runtime", "speculative", "api", "batch", "batch_ray", "bench", "tune", "serve", "format"},
    "api": {"errors", "gguf", "hub", "pairing", "runtime", "speculative", "tune", "format"},
    "testing": {"errors", "gguf", "hub", "runtime"},
    # the HTTP server: above the Python API (Generator, llamaspec/openai/), below the CLI
    "serve": {"errors", "gguf", "hub", "pairing", "runtime", "speculative", "tune", "api", "format"},
}
# the engine and everything below it never reach up into measurement or tuning
BELOW_BENCH = {"gguf", "hub", "pairing", "runtime", "speculative"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if module == "llamaspec.batch.ray_executor":
        return "batch_ray"
    if len(parts) == 1:
        return "api"
    # a package is its own layer (llamaspec/api/: the public Python API); the few top-level modules
    # are the bottom layer, but for __main__
    top = {"__main__": "cli", "_version": "errors", "errors": "errors", "knobs": "errors", "openai": "format"}
    return top.get(parts[1], parts[1])


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    modules.setdefault("llamaspec", PKG / "__init__.py")
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                subs = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in modules]
                names = subs or [stem]  # `from pkg import module`: the dependency is the module
            for name in names:
                # the longest known module this name refers to
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != mod and name.startswith("llamaspec"):
                    graph[mod].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package's __init__ importing its own submodules is not a cycle of concepts; leave it out
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in _graph().items()}
    assert _cycles(graph) == []


def test_layers_depend_one_way():
    bad = []
    for mod, deps in _graph().items():
        layer = _layer(mod)
        for dep in deps:
            dl = _layer(dep)
            if dl != layer and dl not in ALLOWED[layer]:
                bad.append(f"{mod} -> {dep}")
    assert bad == []


def test_no_module_over_400_lines_outside_testing():
    long = [f"{p.relative_to(PKG)}: {n}" for p in PKG.rglob("*.py")
            if "testing" not in p.parts and (n := len(p.read_text().splitlines())) > 420]
    assert long == []


def test_the_top_level_holds_only_the_bottom_layer():
    """The public API is a package (llamaspec/api/), not loose modules beside errors.py."""
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "_version.py", "errors.py", "knobs.py"]


def test_every_module_has_a_layer():
    assert sorted({_layer(m) for m in _graph()} - set(ALLOWED)) == []


def test_engine_and_below_import_neither_bench_nor_tune():
    bad = [f"{mod} -> {dep}" for mod, deps in _graph().items() if _layer(mod) in BELOW_BENCH
           for dep in deps if _layer(dep) in {"bench", "tune"}]
    assert bad == []


def test_no_module_or_package_named_spec():
    # `spec/` reads as a test folder (RSpec, Jasmine) and hides the engine from code maps
    named = [str(p.relative_to(PKG)) for p in PKG.rglob("*") if p.stem == "spec"]
    assert named == []


def test_bench_is_its_own_package_above_the_engine():
    graph = _graph()
    assert {"llamaspec.bench.runner", "llamaspec.bench.suite", "llamaspec.bench.theory",
            "llamaspec.bench.native", "llamaspec.bench.prompts", "llamaspec.bench.results"} <= set(graph)
    assert not [m for m in graph if m.startswith("llamaspec.speculative.bench")]


def _defined(tree: ast.AST) -> set[str]:
    """Every name a module defines or binds: functions, classes, attributes it assigns, arguments,
    variables and imports (its own private names, which it may use on any object)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.alias):
            names.add(n.asname or n.name.split(".")[-1])
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reach_ins(pkg: Path = PKG) -> list[str]:
    """Uses of another module's underscored name: `obj._name` where `_name` is defined elsewhere in
    the package and not in this module, and `from llamaspec.x import _name` (a package-private
    module, `from llamaspec.cli import _output` inside cli/, is not one). `self._x` and
    `cls._x` are the module's own; `os._exit` is no module's of ours."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in pkg.rglob("*.py")}
    own = {p: _defined(t) for p, t in trees.items()}
    ours = set().union(*own.values())
    def name(path: Path) -> str:
        return ".".join(path.relative_to(pkg.parent).with_suffix("").parts).removesuffix(".__init__")

    modules = {name(p) for p in trees}
    hits = []
    for p, tree in trees.items():
        here = name(p) if p.name == "__init__.py" else name(p).rpartition(".")[0]   # its package
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr in ours and n.attr not in own[p]:
                if not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                    hits.append(f"{p.relative_to(pkg.parent)}:{n.lineno}: .{n.attr}")
            elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("llamaspec"):
                for a in n.names:
                    sub = f"{n.module}.{a.name}"
                    same_package = sub in modules and sub.rpartition(".")[0] == here
                    if _private(a.name) and not same_package:
                        hits.append(f"{p.relative_to(pkg.parent)}:{n.lineno}: from {n.module} import {a.name}")
    return hits


def test_no_module_reaches_into_another_modules_private_names():
    """What a module underscores is its own: others use its public names (the engine's `step()`
    and `cached`, the Generator's `prepare()` and `result()`)."""
    assert reach_ins() == []


def test_the_reach_in_check_sees_one(tmp_path):
    pkg = tmp_path / "llamaspec"
    pkg.mkdir()
    (pkg / "engine.py").write_text("class E:\n    def _step(self):\n        self._cached = {}\n")
    (pkg / "server.py").write_text("def run(e):\n    e._step()\n    return e._cached\n")
    (pkg / "ok.py").write_text("import os\n\ndef bye(e):\n    os._exit(1)\n")
    assert sorted(reach_ins(pkg)) == ["llamaspec/server.py:2: ._step", "llamaspec/server.py:3: ._cached"]

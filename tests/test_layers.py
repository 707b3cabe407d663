"""The package's shape: layers depend one way and no module imports itself round a cycle.

The import graph is read from the source (every `import`, function-level ones too), so a lazy
import cannot hide a cycle or a dependency that points up a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "llamaspec"

# layer -> the layers it may import (errors.py and _version.py sit below all; cli and the public
# API, llamaspec/__init__.py, on top)
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
    # a top-level module (generator.py, resolve.py, ...) is the public API, a package its own layer
    top = {"__main__": "cli", "_version": "errors", "errors": "errors", "openai": "format"}
    return top.get(parts[1], "api" if (PKG / f"{parts[1]}.py").is_file() else parts[1])


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

"""The import graph of the project's own packages, read with ``ast`` (issue 26).

* no import cycles between modules (function-level imports count: they only defer a cycle);
* layers import downwards only: ``wmrl_envs`` -> ``wrappers`` -> ``agents`` -> ``benchmarks``,
  and the env floor (``wmrl_envs.autoresearch``) does not import the predictor floor
  (``wmrl_envs.world_models``);
* agents talk to a stack only through ``build_stack`` (and its settings) and the ``StackHandle``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wmrl_envs", "wrappers", "agents", "benchmarks")
LAYER = {"wmrl_envs": 0, "wrappers": 1, "agents": 2, "benchmarks": 3}
#: What agents may take from ``wrappers``: the builder, its settings, and the handle.
AGENT_WRAPPER_API = {"build_stack", "STACKS", "CalibrationConfig", "StackHandle"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every import in the module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.append((base, alias.name, node.lineno))
    return found


def _target(module: str, name: str | None) -> str | None:
    """The project module an import resolves to (a submodule if ``name`` is one)."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for module, alias, _ in _imports(name, path):
            target = _target(module, alias)
            if target is not None and target != name and not name.startswith(target + "."):
                # a module importing its own package's __init__ is the package importing itself
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    graph = _graph()
    assert "agents.grpo.loop" in graph["agents.llm.trainer"] | graph["agents.grpo"]
    assert "wrappers.handle" in graph["wrappers"]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_layers_import_downwards(name):
    own = name.split(".")[0]
    for module, alias, line in _imports(name, MODULES[name]):
        target = _target(module, alias)
        if target is None:
            continue
        layer = target.split(".")[0]
        assert LAYER[layer] <= LAYER[own], f"{name}:{line} imports {target} (layer {layer} is above {own})"
        if name.startswith("wmrl_envs.autoresearch"):
            assert not target.startswith("wmrl_envs.world_models"), f"{name}:{line}: the env floor imports {target}"


def test_agents_use_only_build_stack_and_the_handle():
    for name, path in MODULES.items():
        if not name.startswith("agents"):
            continue
        for module, alias, line in _imports(name, path):
            if module == "wrappers" or module.startswith("wrappers."):
                assert module == "wrappers" and alias in AGENT_WRAPPER_API, (
                    f"{name}:{line} imports {alias or module} from {module}; agents use only {sorted(AGENT_WRAPPER_API)}"
                )

"""The house stays clean: each stage imports only from the floors below it (never back up),
the inventory is pure data, and the board agent needs none of the host's packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.import_graph import PACKAGE, SOURCES, imports

# Lowest first; a module may import edgetune modules of its own floor or below.
FLOORS = [
    "errors",
    "durable",
    "artifact_format",
    "inventory",
    "tvm_compat",
    "compiler",
    "fleet",
    "tune",
    "artifact",
    "agent",
    "deploy",
    "regress",
    "report",
    "pipeline",
    "cli",
]
TOP_LEVEL = {"__init__": 0, "__main__": len(FLOORS)}
PURE_FLOORS = {"errors", "inventory"}  # pure data: no machine, SSH, network or TVM (reading files is fine)


def floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return TOP_LEVEL.get(part, FLOORS.index(part) if part in FLOORS else -1)


def module_name(path: Path) -> str:
    return ".".join(("edgetune", *path.relative_to(PACKAGE).with_suffix("").parts))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_up(path):
    module = module_name(path)
    here = floor_of(module)
    assert here >= 0, f"{module}: not on a floor of {FLOORS}: add it to the list"
    upward = [
        f"{name} (line {line})"
        for name, line in imports(path)
        if name.startswith("edgetune.") and floor_of(name) > here
    ]
    assert not upward, f"{module} imports from a floor above it: {upward}"


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.relative_to(PACKAGE).parts[0].removesuffix(".py") in PURE_FLOORS],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_inventory_and_errors_are_pure(path):
    impure = [
        name
        for name, _ in imports(path)
        if name.split(".")[0] in {"paramiko", "tvm", "starlette", "uvicorn", "xgboost", "socket", "subprocess"}
    ]
    assert not impure, f"{path.name} imports {impure}"


def test_the_agent_imports_nothing_of_the_host_side():
    """The agent's whole import closure (lazy imports too) is the board-side core the bundle
    carries: every edgetune module it reaches is in BOARD_SIDE, and of the rest only the
    standard library, numpy, cryptography and the TVM runtime."""
    from edgetune.fleet.agent_bundle import BOARD_SIDE, board_side_sources

    modules = {module_name(path): path for path in SOURCES}
    reached, todo, outside = set(), [m for m in modules if m.startswith("edgetune.agent")], set()
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for name, line in imports(modules[module]):
            if name == "edgetune" or name.startswith("edgetune."):
                loaded = loaded_modules(name, modules)
                assert loaded, f"{module}:{line} imports {name}, which is not a module of the package"
                todo += loaded
            else:
                outside.add((name.split(".")[0], module, line))
    bundled = {module_name(path) for path in board_side_sources()}
    assert reached <= bundled, f"the agent reaches modules the bundle ({BOARD_SIDE}) lacks: {sorted(reached - bundled)}"
    foreign = [
        f"{module}:{line} imports {top}"
        for top, module, line in outside
        if top not in sys.stdlib_module_names | {"numpy", "cryptography", "tvm"}
    ]
    assert not foreign, foreign
    tvm_uses = {name for module in reached for name, _ in imports(modules[module]) if name.split(".")[0] == "tvm"}
    assert all(name == "tvm" or name.startswith("tvm.runtime") for name in tvm_uses), (
        f"beyond TVM's runtime: {tvm_uses}"
    )


def loaded_modules(name: str, modules: dict[str, Path]) -> list[str]:
    """The package's modules that `import name` runs: its own (or its package's __init__, or
    for `from package import name` the package's) and the __init__ of every package above it."""
    own = next((m for m in (name, f"{name}.__init__", f"{name.rsplit('.', 1)[0]}.__init__") if m in modules), None)
    parts = name.split(".")
    inits = [f"{'.'.join(parts[:i])}.__init__" for i in range(1, len(parts))]
    return [m for m in (own, *inits) if m in modules] if own else []


def test_no_import_circle_between_modules():
    """A module never imports, directly or through others (lazy imports count too), a module
    that imports it back: each piece lives in the one module the others build on."""
    modules = {module_name(path): path for path in SOURCES}
    graph = {
        module: {name for name, _ in imports(path) if name in modules and name != module}
        for module, path in modules.items()
    }
    circles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            module, route = stack.pop()
            for name in graph[module]:
                if name == start:
                    circles.append(" -> ".join((*route, name)))
                elif name not in seen:
                    seen.add(name)
                    stack.append((name, (*route, name)))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))

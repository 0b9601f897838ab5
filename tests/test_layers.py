"""The house stays clean: each stage imports only from the floors below it (never back up),
the inventory is pure data, and the board agent needs none of the host's packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgetune"

# Lowest first; a module may import edgetune modules of its own floor or below.
FLOORS = ["errors", "durable", "inventory", "fleet", "tune", "artifact", "agent", "deploy", "regress", "pipeline", "cli"]
TOP_LEVEL = {"__init__": 0, "__main__": len(FLOORS)}
PURE_FLOORS = {"errors", "inventory"}  # pure data: no machine, SSH, network or TVM (reading files is fine)
HOST_PACKAGES = {"paramiko", "yaml", "tabulate", "onnx", "onnxruntime", "xgboost", "matplotlib", "starlette", "uvicorn", "tvm"}


def floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return TOP_LEVEL.get(part, FLOORS.index(part) if part in FLOORS else -1)


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in the file, at any depth (lazy imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def module_name(path: Path) -> str:
    return ".".join(("edgetune", *path.relative_to(PACKAGE).with_suffix("").parts))


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_up(path):
    module = module_name(path)
    here = floor_of(module)
    assert here >= 0, f"{module}: not on a floor of {FLOORS}: add it to the list"
    upward = [f"{name} (line {line})" for name, line in imports(path)
              if name.startswith("edgetune.") and floor_of(name) > here]  # fmt: skip
    assert not upward, f"{module} imports from a floor above it: {upward}"


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(PACKAGE).parts[0].removesuffix(".py") in PURE_FLOORS],
                         ids=lambda p: str(p.relative_to(PACKAGE)))  # fmt: skip
def test_inventory_and_errors_are_pure(path):
    impure = [name for name, _ in imports(path) if name.split(".")[0] in {"paramiko", "tvm", "starlette", "uvicorn", "xgboost", "socket", "subprocess"}]
    assert not impure, f"{path.name} imports {impure}"


def test_the_agent_imports_nothing_of_the_host_side():
    agent_modules = sorted((PACKAGE / "agent").glob("*.py"))
    for path in agent_modules:
        for name, line in imports(path):
            top = name.split(".")[0]
            assert top not in HOST_PACKAGES - {"tvm"}, f"{path.name}:{line} imports {name}"
            assert not name.startswith(("edgetune.fleet", "edgetune.inventory", "edgetune.tune", "edgetune.deploy")), f"{path.name}:{line} imports {name}"


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

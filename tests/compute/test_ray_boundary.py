"""Ray is an outside system behind one door: only edgetune/tune/on_ray/ imports it (lazy imports
too), and edgetune imports that package only where `compute: ray` asks for it."""

from __future__ import annotations

import ast

from support.import_graph import PACKAGE, SOURCES, imports

from edgetune.tune import (
    _PUBLIC,  # the names `edgetune.tune` loads from their module on first use
)

ON_RAY = PACKAGE / "tune" / "on_ray"


def test_only_the_on_ray_package_imports_ray():
    outside = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in SOURCES
        if not path.is_relative_to(ON_RAY)
        for name, line in imports(path)
        if name.split(".")[0] == "ray"
    ]
    assert not outside, outside


def test_modules_outside_it_reach_it_only_from_inside_a_function():
    """A top-level import would load Ray on every run, `compute: local` ones too."""
    through_tune = {name for name, module in _PUBLIC.items() if module.startswith("on_ray")}
    eager = []
    for path in SOURCES:
        if path.is_relative_to(ON_RAY):
            continue
        for node in ast.parse(path.read_text()).body:
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
                if node.module == "edgetune.tune" and through_tune & {alias.name for alias in node.names}:
                    modules.append("edgetune.tune.on_ray")
            if any(module.startswith("edgetune.tune.on_ray") for module in modules):
                eager.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not eager, eager

"""edgetune's sources and the imports each makes, read with `ast` (nothing imported): what the
tests of the floors and of the one-door rule (Ray) check."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "edgetune"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in the file, at any depth (lazy imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found

"""backend.py is specli's only importer of llama_cpp."""

from __future__ import annotations

import ast
from pathlib import Path

SPECLI = Path(__file__).resolve().parent.parent / "specli"


def importers(package: str) -> set[str]:
    """specli's modules that import `package` or one of its submodules, anywhere in the file."""
    found = set()
    for path in SPECLI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(name == package or name.startswith(package + ".") for name in names):
                found.add(str(path.relative_to(SPECLI)))
    return found


def test_only_backend_imports_llama_cpp():
    assert importers("llama_cpp") == {"backend.py"}

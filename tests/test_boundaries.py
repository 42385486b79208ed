"""The layers of specli, read from the code: who may import what, and no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECLI = ROOT / "specli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(path: Path) -> list[str]:
    """Every module name an import statement in the file names, inside functions and
    `if TYPE_CHECKING:` too: an import hidden in a function still ties two layers."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]  # `from specli import x`
    return names


def importers(package: str) -> set[str]:
    """specli's modules that import `package` or one of its submodules, anywhere in the file."""
    return {str(path.relative_to(SPECLI)) for path in SPECLI.rglob("*.py")
            if any(name == package or name.startswith(package + ".") for name in _imported_names(path))}


def import_graph() -> dict[str, set[str]]:
    """specli's modules, each with the specli modules it imports (itself left out)."""
    modules = {_module_name(path): path for path in SPECLI.rglob("*.py")}
    return {module: {name for name in _imported_names(path) if name in modules and name != module}
            for module, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules, in order), or [] where there is none."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state:
                found = visit(imported)
                if found:
                    return found
        state[module] = "done"
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return []


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle_in_specli():
    graph = import_graph()
    assert "specli.decode.engine" in graph and "specli.llama.backend" in graph["specli.session"], "the graph is read"
    assert cycle(graph) == []


def test_only_backend_and_the_mtp_and_mtmd_bindings_import_llama_cpp():
    assert importers("llama_cpp") == {"llama/backend.py", "llama/mtp.py", "llama/vision.py"}


def test_only_the_vision_module_imports_mtmd():
    assert importers("llama_cpp.mtmd_cpp") == {"llama/vision.py"}


def test_only_the_constraint_module_imports_llguidance():
    assert importers("llguidance") == {"decode/constraint.py"}


def test_only_hub_imports_huggingface_hub():
    assert importers("huggingface_hub") and all(module.startswith("models/hub/") for module in importers("huggingface_hub"))


def test_the_device_probe_and_the_rpc_client_do_not_import_the_binding():
    graph = import_graph()
    for module in ("specli.llama.devices", "specli.llama.rpc", "specli.install"):
        assert "specli.llama.backend" not in graph[module], module
    assert graph["specli.install"] == set(), "install hints are a leaf"


def test_sampling_is_pure_numpy_and_the_engine_never_prints():
    assert {name.split(".")[0] for name in _imported_names(SPECLI / "decode" / "sampling.py")} <= {
        "__future__", "dataclasses", "numpy", "typing", "math", "hashlib", "struct"}
    engine = (SPECLI / "decode" / "engine.py").read_text(encoding="utf-8")
    assert "print(" not in engine and "sys.stdout" not in engine and "sys.stderr" not in engine


LAYERS = {  # a package, and the specli packages and modules it must never import
    "specli.decode": ("specli.llama", "specli.models", "specli.commands", "specli.serve", "specli.session",
                      "specli.drafts", "specli.pricing", "specli.stream", "specli.render", "specli.prompt",
                      "specli.comparison", "specli.diagnostics"),
    "specli.llama": ("specli.decode", "specli.models", "specli.commands", "specli.serve", "specli.session",
                     "specli.drafts", "specli.pricing", "specli.stream", "specli.comparison", "specli.diagnostics"),
    "specli.models": ("specli.commands", "specli.serve", "specli.session", "specli.drafts", "specli.pricing",
                      "specli.stream", "specli.comparison", "specli.diagnostics", "specli.llama.backend"),
    "specli.serve": ("specli.commands",),
    "specli.pricing": ("specli.commands", "specli.serve", "specli.session", "specli.drafts", "specli.stream",
                       "specli.comparison", "specli.diagnostics"),
    "specli.session": ("specli.commands", "specli.serve", "specli.stream", "specli.comparison"),
    "specli.drafts": ("specli.commands", "specli.serve", "specli.stream", "specli.comparison", "specli.session"),
    "specli.stream": ("specli.commands", "specli.serve", "specli.session", "specli.drafts", "specli.pricing"),
    "specli.tools": ("specli.serve", "specli.commands", "specli.session", "specli.drafts", "specli.pricing",
                     "specli.llama"),
}


def test_layers_point_one_way():
    """The pipeline reads top down: commands and serve use session and stream, which use the
    decoding algorithm, the llama.cpp binding and the model files; none of those looks up."""
    graph = import_graph()
    broken = [(module, imported) for module, imports in graph.items() for layer, banned in LAYERS.items()
              if module == layer or module.startswith(layer + ".")
              for imported in imports if any(imported == b or imported.startswith(b + ".") for b in banned)]
    assert broken == []


def test_the_decoding_algorithm_does_not_import_pricing():
    """decode/ holds the pure cost maths; measuring the loaded models and storing what they
    cost (specli.pricing) needs the binding and the devices, which decode/ may not import."""
    graph = import_graph()
    assert "specli.pricing" in graph and "specli.decode.costs" in graph["specli.pricing"], "the graph is read"
    assert [module for module in graph if module.startswith("specli.decode") and "specli.pricing" in graph[module]] == []


# Constructors of proposers and draft-length policies: Session.engine_for builds them, once
# (a kind's own proposer through its record in drafts.py, which only engine_for calls).
ASSEMBLY = {"NGramProposer", "DraftModelProposer", "MtpProposer", "LookupThenModel", "TranslatedDraft", "NoProposer",
            "AdaptiveDraftPolicy", "FixedDraftPolicy"}


def test_only_the_session_assembles_proposers_and_policies():
    builders = {str(path.relative_to(SPECLI)) for path in SPECLI.rglob("*.py")
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ASSEMBLY}
    assert builders == {"session.py", "drafts.py"}


def _names(node: ast.AST) -> list[str]:
    return [part.id if isinstance(part, ast.Name) else part.attr for part in ast.walk(node)
            if isinstance(part, (ast.Name, ast.Attribute))]


# Where draft kinds may be told apart by name: their records, and plain decoding's name.
KIND_TELLERS = {"drafts.py", "decode/request.py"}


def _compares_a_kind(node: ast.AST, kinds: set[str]) -> bool:
    """`draft == "ngram"`, `kind is DraftKind.MTP`, `proposer.name != "none"`..."""
    return isinstance(node, ast.Compare) and any(
        isinstance(c, ast.Constant) and c.value in kinds
        or isinstance(c, ast.Attribute) and isinstance(c.value, ast.Name) and c.value.id == "DraftKind"
        for c in ast.walk(node)) and any("draft" in name or "proposer" in name or "kind" in name
                                         for name in _names(node))


def test_draft_kinds_are_told_apart_only_by_their_records():
    """A draft kind is named by a string, checked against specli/drafts.py at the edge (the
    CLI's --draft, a request's `draft`, a pair's), and what differs between kinds is read from
    its record: no `draft == "ngram"`, `kind is DraftKind.MTP` or `proposer.name != "none"`
    anywhere else."""
    from specli import drafts

    kinds = set(drafts.KINDS)
    compared = [f"{path.relative_to(SPECLI)}:{node.lineno}" for path in SPECLI.rglob("*.py")
                if str(path.relative_to(SPECLI)) not in KIND_TELLERS
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _compares_a_kind(node, kinds)]
    assert compared == []


def test_the_draft_kind_check_finds_a_comparison_by_name():
    for code in ('spec.draft == "ngram" or proposer.name != "none"', "request.draft is DraftKind.MTP",
                 "kind.name in (DraftKind.MODEL, x)"):
        assert _compares_a_kind(next(node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Compare)),
                                {"ngram", "none"}), code
    assert not _compares_a_kind(ast.parse("kind.build is None").body[0].value, {"ngram", "none"})


def test_the_readme_and_doctor_suggest_the_same_gpu_installs():
    from specli.install import GPU_INSTALL

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in GPU_INSTALL.values():
        assert f"`{command}`" in readme, command

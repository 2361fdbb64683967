"""The house: every module of the package imports only from its own layer or the layers below, and no two modules
import each other, directly or through others. The imports are read with `ast`, top-level and deferred alike."""

from __future__ import annotations

import ast
from pathlib import Path

import unmask

ROOT = Path(unmask.__file__).parent

# lowest first; a module may import from its own layer and any layer before it
LAYERS = [
    ("base", ["unmask.errors", "unmask.io", "unmask.config", "unmask.heads", "unmask.runtime", "unmask.metrics",
              "unmask.progress"]),
    ("hub", ["unmask.hub"]),
    ("models", ["unmask.models"]),
    ("data", ["unmask.data", "unmask.tokenizer", "unmask.objectives"]),
    ("pipelines", ["unmask.pipelines"]),
    ("train", ["unmask.train"]),
    ("entry points", ["unmask.serve", "unmask.cli", "unmask.demo", "unmask.quickstart", "unmask.example_data",
                      "unmask.__main__", "unmask"]),
]


def module_name(path: Path) -> str:
    parts = ("unmask", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer whose prefix is the longest match (`unmask` itself, the package's `__init__`, comes last)."""
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    assert index is not None, f"{module} is in no layer: add it to LAYERS"
    return index


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports: `from unmask.x import y` is y when y is a module, else x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found |= {submodule if submodule in modules else node.module} & modules
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in ROOT.rglob("*.py")}
    modules = set(files)
    return {name: imports(path, modules) - {name} for name, path in files.items()}


def test_every_module_imports_only_downward():
    upward = [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for module, targets in graph().items() for target in targets
              if layer_of(target) > layer_of(module)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in edges.items()}
    state: dict[str, str] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges.get(module, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def test_the_layer_table_is_checked_against_known_crossings(tmp_path):
    """The checks can fail: a model module that imported the training loop would be reported."""
    assert layer_of("unmask.train.loop") > layer_of("unmask.models.bert")
    assert layer_of("unmask.models.outputs") > layer_of("unmask.hub") > layer_of("unmask.io")
    source = tmp_path / "probe.py"
    source.write_text("from unmask.train import loop\nimport unmask.models.bert\nfrom unmask import Tokenizer\n")
    assert imports(source, {"unmask", "unmask.train", "unmask.train.loop", "unmask.models.bert"}) == {
        "unmask", "unmask.train.loop", "unmask.models.bert"}


def test_the_readme_layout_names_every_module():
    readme = (ROOT.parents[1] / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    layout = layout[: layout.index("\n## ")] if "\n## " in layout else layout
    files = [path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py")
             if path.name not in ("__init__.py", "__main__.py")]
    missing = [f for f in files if f not in layout and f.split("/")[-1] not in layout]
    assert not missing, f"README's Layout does not name {missing}"

"""The package's shape, held to what CONTRIBUTING.md says of it: the map names every module and
only modules that exist, the layers import downwards only, nothing imports in a circle, no two
modules share a name, and the line budgets hold."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cl_audit import audit_model
from cl_audit.cli import app
from cl_audit.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cl_audit"
# bottom up: a layer imports only from those before it (and the root's vocabulary)
LAYERS = ("rule", "report", "compat", "predict", "fake", "intercept", "compare", "execution",
          "compiled", "phases", "sources", "features", "sweep", "render", "integrations",
          "cli")  # fmt: skip
VOCABULARY = {"enums", "errors", "registry"}
FACE = {"__init__", "__main__", "testing"}  # the package's public face: nothing imports it
MODULE_LINES, APP_LINES = 450, 80


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the package's modules (a name imported from a package that is
    itself a module counts as that module)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cl_audit"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.startswith("cl_audit"))
    return graph


def _room(module: str) -> str:
    """The folder a module lies in (its layer), or the module itself at the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_the_map_names_every_module_and_only_modules_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Where things live") :]
    found = re.findall(r"`([\w/]+\.py)`", section)
    named = {n for n in found if not n.startswith(("tests/", "scripts/"))}
    missing = sorted(n for n in named if not (PACKAGE / n).is_file())
    assert missing == [], "the map names modules that do not exist"
    unnamed = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if str(p.relative_to(PACKAGE)) not in named
        and not (p.name == "__init__.py" and len(ast.parse(p.read_text()).body) <= 1)
    )
    assert unnamed == [], "modules the map does not name (a docstring-only __init__ may go)"
    layers = set(re.findall(r"^\| `(\w+)/` \|", section, re.M))
    assert layers >= set(LAYERS)


def test_no_import_circles_between_modules_or_between_folders():
    graph = _imports(_modules())
    assert _cycles(graph) == []
    rooms: dict[str, set[str]] = defaultdict(set)
    for module, imported in graph.items():
        rooms[_room(module)].update(_room(i) for i in imported if _room(i) != _room(module))
    assert _cycles(rooms) == []


def test_each_layer_imports_only_the_layers_below_it_and_the_vocabulary():
    graph = _imports(_modules())
    upward = []
    for module, imported in graph.items():
        room = _room(module)
        if room not in LAYERS:
            continue
        allowed = set(LAYERS[: LAYERS.index(room) + 1]) | {f"cl_audit.{v}" for v in VOCABULARY}
        upward += [(module, i) for i in imported if _room(i) not in allowed]
    assert upward == []


def test_no_two_modules_share_a_name_and_the_budgets_hold():
    modules = _modules()
    stems = defaultdict(list)
    for name, path in modules.items():
        if path.name != "__init__.py":
            stems[path.stem].append(name)
    assert {s: n for s, n in stems.items() if len(n) > 1} == {}
    lines = {n: len(p.read_text().splitlines()) for n, p in modules.items()}
    assert {n: k for n, k in lines.items() if k > MODULE_LINES} == {}
    assert lines["cl_audit.cli"] <= APP_LINES  # the app only: each command has its module


def test_the_root_holds_only_the_vocabulary_and_the_public_face():
    assert {p.stem for p in PACKAGE.glob("*.py")} == VOCABULARY | FACE
    graph = _imports(_modules())
    faces = {"cl_audit"} | {f"cl_audit.{f}" for f in FACE - {"__init__"}}
    assert {(m, i) for m, imported in graph.items() for i in imported if i in faces} == set()


def test_the_core_names_api_parameters_and_the_cli_shows_its_flags():
    """The same refusal in each one's words: ``force_layout_opt`` needs ``compile``."""
    with pytest.raises(UsageError, match="`force_layout_opt` decides `compile`'s graphs"):
        audit_model(torch.nn.Conv2d(3, 4, 3), torch.randn(2, 3, 8, 8), force_layout_opt=True)
    result = CliRunner().invoke(app, ["resnet18", "--force-layout-opt"])
    assert result.exit_code == 2
    assert "--force-layout-opt decides --compile's graphs again: add --compile" in result.output
    assert "`" not in result.output

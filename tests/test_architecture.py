"""The import graph keeps its shape: the core and the strategies import no adapter, the rooms of
``adapters/`` import one way with no circle, and no module grows past 400 lines.

The checker reads the source with ``ast`` (every import, lazy ones inside functions too) and is
itself tested on planted violations in a throw-away tree.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "esbox": "esbox",
    "strategies": "esbox.strategies",
    "adapters": "esbox.adapters",
    "cli": "esbox.cli",
}
MAX_LINES = 400
LINE_LIMITED = ("esbox", "strategies", "adapters", "cli", "benchmarks")

# Which rooms of esbox.adapters each room may import (besides itself and the core); docs/
# architecture.md draws the same table. A new room must be added here.
ALLOWED: dict[str, set[str]] = {
    "functions": set(),
    "models": set(),
    "generation": {"models"},
    "environments": set(),
    "tasks": {"generation", "models", "environments"},
    "agents": {"tasks", "generation", "models", "environments"},
    "scale": set(),
    "nevergrad": set(),
    "problems": {"functions", "models", "generation", "tasks", "agents", "scale", "environments"},
    "rl": {"problems", "tasks", "agents", "generation", "models", "environments"},
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted import name
    path: Path
    is_package: bool


def modules(root: Path, folders: Mapping[str, str] = FOLDERS) -> Iterator[Module]:
    """Every Python module under the mapped folders, with its import name."""
    for folder, prefix in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            package = parts[-1] == "__init__"
            if package:
                parts.pop()
            yield Module(".".join([prefix, *parts]), path, package)


def imports(module: Module, top_level_only: bool = False) -> set[str]:
    """Dotted names ``module`` imports (relative imports resolved; ``from a import b`` gives
    ``a.b`` too, since ``b`` may be a submodule)."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
    return found


def room_of(name: str) -> str | None:
    """The adapters room of a dotted name (None outside ``esbox.adapters`` or at its root)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["esbox", "adapters"] else None


def layer_of(name: str) -> str:
    for layer in ("esbox.adapters", "esbox.strategies", "esbox.cli"):
        if name == layer or name.startswith(layer + "."):
            return layer
    return "esbox"


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of a directed graph as a closed path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def violations(
    root: Path,
    folders: Mapping[str, str] = FOLDERS,
    allowed: Mapping[str, set[str]] = ALLOWED,
    line_limited: tuple[str, ...] = LINE_LIMITED,
) -> list[str]:
    """Every broken rule of the tree at ``root``, one line each."""
    found: list[str] = []
    mods = list(modules(root, folders))
    known = {m.name for m in mods}
    rooms: dict[str, set[str]] = {}
    for module in mods:
        layer, own_room = layer_of(module.name), room_of(module.name)
        if own_room is not None and own_room not in allowed:
            found.append(f"{module.name}: room '{own_room}' is not declared in ALLOWED")
        for target in imports(module):
            if not target.startswith("esbox"):
                continue
            target_layer = layer_of(target)
            if layer in ("esbox", "esbox.strategies") and target_layer in (
                "esbox.adapters",
                "esbox.cli",
            ):
                found.append(f"{module.name} imports {target}: the core and strategies import "
                             "no adapter and no CLI")
            if layer == "esbox.adapters" and target_layer == "esbox.cli":
                found.append(f"{module.name} imports {target}: adapters never import the CLI")
            target_room = room_of(target)
            if own_room and target_room and target_room != own_room and target in known:
                rooms.setdefault(own_room, set()).add(target_room)
                if target_room not in allowed.get(own_room, set()):
                    found.append(f"{module.name} imports {target}: room '{own_room}' may not "
                                 f"import room '{target_room}'")
    if cycle := find_cycle(rooms):
        found.append("circle between rooms: " + " -> ".join(cycle))
    top = {m.name: {t for t in imports(m, top_level_only=True) if t in known} for m in mods}
    for name in top:  # importing a package imports its __init__ first: no arrow back to it
        top[name] = {t for t in top[name] if t != name and not name.startswith(t + ".")}
    if cycle := find_cycle(top):
        found.append("circle between modules at import time: " + " -> ".join(cycle))
    for folder in line_limited:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines (at most {MAX_LINES})")
    return found


def test_the_repository_keeps_its_import_rules():
    assert violations(ROOT) == []


def test_every_room_is_declared_and_documented():
    rooms = {p.parent.name for p in (ROOT / "adapters").glob("*/__init__.py")}
    assert rooms == set(ALLOWED)
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for room in rooms:
        assert f"`{room}`" in architecture


# -- the checker catches what it should: a planted tree ------------------------------------------
def plant(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


CLEAN = {
    "esbox/__init__.py": "",
    "esbox/space.py": "import numpy\n",
    "strategies/__init__.py": "",
    "strategies/es.py": "from esbox.space import x\n",
    "adapters/__init__.py": "",
    "adapters/models/__init__.py": "from .space import TorchSpace\n",
    "adapters/models/space.py": "from esbox.space import x\n",
    "adapters/tasks/__init__.py": "",
    "adapters/tasks/rollouts.py": "from esbox.adapters.models.space import TorchSpace\n",
    "cli/__init__.py": "",
    "cli/main.py": "from esbox.adapters.tasks import rollouts\n",
    "benchmarks/suite.py": "",
}
PLANTED = {
    "core imports an adapter": (
        {"esbox/space.py": "def f():\n    from esbox.adapters.models import space\n"},
        "esbox.space imports esbox.adapters.models",
    ),
    "strategy imports an adapter": (
        {"strategies/es.py": "from esbox.adapters.tasks.rollouts import R\n"},
        "esbox.strategies.es imports esbox.adapters.tasks.rollouts",
    ),
    "room imports a room it may not": (
        {"adapters/models/space.py": "from ..tasks import rollouts\n"},
        "room 'models' may not import room 'tasks'",
    ),
    "circle between rooms": (
        {"adapters/models/space.py": "def f():\n    from esbox.adapters.tasks import rollouts\n"},
        "circle between rooms: models -> tasks -> models",
    ),
    "circle between modules": (
        {
            "adapters/tasks/a.py": "from . import b\n",
            "adapters/tasks/b.py": "from esbox.adapters.tasks import a\n",
        },
        "circle between modules at import time: esbox.adapters.tasks.a -> "
        "esbox.adapters.tasks.b -> esbox.adapters.tasks.a",
    ),
    "adapter imports the CLI": (
        {"adapters/tasks/rollouts.py": "import esbox.cli.main\n"},
        "adapters never import the CLI",
    ),
    "undeclared room": ({"adapters/web/__init__.py": ""}, "room 'web' is not declared"),
    "long module": ({"benchmarks/suite.py": "x = 1\n" * 401}, "401 lines (at most 400)"),
}


def test_the_planted_clean_tree_passes(tmp_path):
    assert violations(plant(tmp_path, CLEAN)) == []


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_planted_violation_is_reported(tmp_path, case):
    changes, expected = PLANTED[case]
    found = violations(plant(tmp_path, {**CLEAN, **changes}))
    assert any(expected in line for line in found), found


def test_allowed_rooms_form_no_circle():
    assert find_cycle(ALLOWED) is None

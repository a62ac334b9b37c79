"""The house rules, checked on the source: arrows point one way, no circles, rooms of readable size.

flows -> tasks -> thrifty <- training: the library imports none of the others (not even inside a
function), the training program imports no Prefect, and a dry-run `thrifty archive` or the CLI's
help loads neither torch nor Prefect.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, python_env

PACKAGES = ("thrifty", "training", "tasks", "flows", "deployments")
# what each package may import from the others (the library and the node program never reach up)
ALLOWED = {
    "thrifty": {"thrifty"},
    "training": {"thrifty", "training"},
    "tasks": {"thrifty", "training", "tasks"},
    "flows": {"thrifty", "training", "tasks", "flows"},
    "deployments": {"thrifty", "deployments"},
}
MAX_LINES = 450


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(path: Path, name: str, top_level_only: bool) -> set[str]:
    """Modules ``path`` imports; every import when not ``top_level_only`` (function bodies too)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative import
                pkg = name.split(".")[: -node.level] if not path.name == "__init__.py" else name.split(".")
                base = ".".join(pkg + [node.module])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_arrows_point_one_way():
    wrong = []
    for name, path in modules().items():
        pkg = name.split(".")[0]
        for target in imports(path, name, top_level_only=False):
            top = target.split(".")[0]
            if top in PACKAGES and top not in ALLOWED[pkg]:
                wrong.append(f"{name} imports {target}")
            if pkg == "training" and top == "prefect":
                wrong.append(f"{name} imports {target}: the node program runs without Prefect")
            if pkg == "thrifty" and top == "prefect":
                wrong.append(f"{name} imports {target}: the library imports no Prefect")
            node_side, launch_side = "thrifty.launchers.notice", "thrifty.launchers.skypilot"
            for a, b in ((node_side, launch_side), (launch_side, node_side)):
                if name.startswith(a) and target.startswith(b):
                    wrong.append(f"{name} imports {target}: they share thrifty.protocol, not each other")
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    mods = modules()
    graph = {name: {t for t in imports(path, name, top_level_only=True) if t in mods and t != name}
             for name, path in mods.items()}
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in seen:
                visit(nxt, stack + [nxt])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_rooms_are_readable_size():
    big = {str(p.relative_to(REPO)): n for p in modules().values()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"split these by concern: {big}"


@pytest.mark.parametrize("code", [
    "import thrifty.archive, thrifty.cli, thrifty.checkpoints, thrifty.budget, thrifty.savings",
    "import thrifty.simulate, thrifty.simulate_inputs, thrifty.simulate_report, thrifty.preemption, thrifty.daly",
    "import sys; sys.argv = ['thrifty', 'archive', '--help']\n"
    "import thrifty.cli\ntry:\n    thrifty.cli.main()\nexcept SystemExit:\n    pass",
])
def test_the_library_loads_without_torch_or_prefect(code):
    probe = code + "\nimport sys\nprint(sorted(m for m in ('torch', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], env=python_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout

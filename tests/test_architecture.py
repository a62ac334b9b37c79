"""The house rules, checked on the source: arrows point one way, no circles, rooms of readable size.

flows -> tasks -> thrifty <- training, and flows -> deployments -> thrifty (a run names its deployment's upcoming
runs as `thrifty deploy` does): the library imports none of the others (not even inside a
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
    "flows": {"thrifty", "training", "tasks", "flows", "deployments"},  # deployments.upcoming names the next runs
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


# the library's rooms, bottom up: a module may import its own layer and those below it, never one above
LAYERS = (
    ("thrifty.protocol", "thrifty.procs", "thrifty.faults", "thrifty.numbers"),
    ("thrifty.config", "thrifty.storage"),
    ("thrifty.runs",),
    ("thrifty.money",),
    ("thrifty.spot", "thrifty.report"),
    ("thrifty.launchers", "thrifty.archive", "thrifty.usercode"),
    ("thrifty.sweep", "thrifty.results"),
    ("thrifty.session", "thrifty.cli"),
)


def room(module: str) -> str | None:
    for layer in LAYERS:
        for name in layer:
            if module == name or module.startswith(name + "."):
                return name
    return None


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if room(module) in layer)


def test_every_library_module_has_a_room():
    homeless = [name for name in modules() if name.startswith("thrifty.") and room(name) is None]
    assert not homeless, f"add these to LAYERS (and say what they may import in their package's __init__): {homeless}"


def test_the_library_imports_down_its_layers():
    up = []
    for name, path in modules().items():
        if not name.startswith("thrifty.") or room(name) is None:
            continue
        for target in imports(path, name, top_level_only=False):
            if target.startswith("thrifty.") and room(target) and layer_of(target) > layer_of(name):
                up.append(f"{name} imports {target} (a layer above {room(name)})")
    assert not up, "\n".join(sorted(set(up)))


def test_no_import_circles():
    """No circle anywhere, counting imports inside functions too: a lazy import hides a circle, it does not end it."""
    mods = modules()

    def resolve(target: str) -> str | None:  # `from pkg import name` names a module or something in one
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    graph = {name: {m for t in imports(path, name, top_level_only=False)
                    if (m := resolve(t)) and m != name and not name.startswith(m + ".")}
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
    "import thrifty.archive, thrifty.cli, thrifty.runs.checkpoints, thrifty.money.budget, thrifty.money.savings",
    "import thrifty.spot.simulate, thrifty.spot.simulate_inputs, thrifty.spot.simulate_report, thrifty.spot.preemption, thrifty.spot.daly",
    "import sys; sys.argv = ['thrifty', 'archive', '--help']\n"
    "import thrifty.cli\ntry:\n    thrifty.cli.main()\nexcept SystemExit:\n    pass",
])
def test_the_library_loads_without_torch_or_prefect(code):
    probe = code + "\nimport sys\nprint(sorted(m for m in ('torch', 'prefect') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], env=python_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout

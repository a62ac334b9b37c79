"""What ``recipe: package.module:function`` may name, checked before any of it runs.

A recipe is a function that declares it returns a ``training.recipes.Recipe`` (``def recipe() -> Recipe:``). That
declaration is read from the module's source before the module is imported: a spec naming anything else
(``os:abort``, ``sys:exit``, ``tempfile:mkdtemp``) is refused without importing its module or calling anything, so a
RunConfig, which anyone who can fill a deployment's form writes, cannot make a worker run arbitrary functions.
Importing a module that declares a recipe runs its top-level code; ``training.recipes.base.resolve_recipe`` then
checks the function object itself again before calling it. Torch-free.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from importlib.util import resolve_name
from pathlib import Path

from thrifty.config import ConfigError
from thrifty.config.echo import shown

RETURNS = "Recipe"  # the return annotation that declares a recipe factory (training.recipes.Recipe)
HOW = ("a recipe is a function in a Python module that takes no arguments and declares that it returns a "
       "training.recipes.Recipe: `from training.recipes import Recipe` and `def recipe() -> Recipe:`")
_MAX_HOPS = 4  # `from .impl import recipe` re-exports followed this far


def split_spec(spec: str) -> tuple[str, str]:
    module, _, func = spec.partition(":")
    return module, func


def find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` would be imported from, found without importing it or its parent packages (the import
    system's finders are asked with each parent's search path, which ``importlib.util.find_spec`` gets by importing
    the parents)."""
    path = None
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        if loaded is not None:
            spec = getattr(loaded, "__spec__", None)
        else:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(full, path)
                except (ImportError, ValueError, OSError):
                    spec = None
                if spec is not None:
                    break
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None  # a module, not a package: it has no submodules to find
        path = list(path) if path is not None else None
    return spec


def _source(spec: importlib.machinery.ModuleSpec) -> str | None:
    loader = spec.loader
    try:
        if loader is not None and hasattr(loader, "get_source"):
            return loader.get_source(spec.name)
        if spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin).read_text()
    except (ImportError, OSError, UnicodeDecodeError):
        return None
    return None


def _annotated_recipe(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if isinstance(node, ast.AsyncFunctionDef) or node.returns is None:
        return False
    text = ast.unparse(node.returns).strip("'\"")
    return text.rpartition(".")[2] == RETURNS


def declares_recipe(module: str, func: str, hops: int = _MAX_HOPS) -> str | None:
    """None if ``module`` declares (in its source) a top-level function ``func`` annotated to return a Recipe,
    directly or through ``from ... import func``; else why not, in words."""
    spec = find_module(module)
    if spec is None:
        return "not found"
    source = _source(spec)
    if source is None:
        return f"module {module!r} has no Python source to read (a built-in or compiled module)"
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"module {module!r} cannot be parsed ({type(exc).__name__})"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
            return None if _annotated_recipe(node) else (
                f"{module}:{func} does not declare that it returns a Recipe (no `-> Recipe`)")
        if isinstance(node, ast.ImportFrom) and hops > 0:
            for alias in node.names:
                if (alias.asname or alias.name) == func and alias.name != "*":
                    package = module if spec.submodule_search_locations is not None else module.rpartition(".")[0]
                    try:
                        origin = resolve_name("." * node.level + (node.module or ""), package) if node.level else \
                            node.module
                    except (ImportError, ValueError):
                        return f"{module}:{func} is imported from a module that cannot be found"
                    if origin is None:
                        return f"{module}:{func} is imported from a module that cannot be found"
                    return declares_recipe(origin, alias.name, hops - 1)
    return f"module {module!r} defines no function {func!r} at its top level"


def check_recipe_spec(spec: str) -> tuple[str, str]:
    """The (module, function) of a ``package.module:function`` spec whose function is declared a recipe factory;
    else a ConfigError naming the fix. Nothing is imported or called."""
    module, func = split_spec(spec)
    why = declares_recipe(module, func)
    if why == "not found":
        raise ConfigError(
            f"'recipe': cannot import module {module!r} for recipe {shown(spec)} (not found). Run thrifty from the "
            f"directory that holds {module.split('.')[0]!r} (it is importable from there, as on a cloud node, whose "
            "current directory is compute.workdir), check that its package is installed (pip install -e .), or add "
            "its parent directory to PYTHONPATH.")
    if why is not None:
        raise ConfigError(f"'recipe': {shown(spec)} is not a recipe: {why}. Nothing of it was run: {HOW}.")
    return module, func

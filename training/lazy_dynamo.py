"""torch._dynamo only when something compiles: an optimizer must not cost a node 1-2 s of start-up.

torch 2.13's optimizers import ``torch._dynamo`` (and with it sympy and inductor's config, which leaves a
``torchinductor_<user>`` folder in the temp directory) though nothing compiles: ``Optimizer.step`` calls
``torch._dynamo.graph_break()`` (a no-op outside a compiled region), and ``add_param_group``, ``zero_grad``,
``state_dict`` and ``load_state_dict`` ask ``torch._dynamo.disable`` for a marker that means "never compile
this" (it calls the function as it is outside a compiled region). No setting turns that off.

``defer_dynamo_import()`` registers a stand-in for ``torch._dynamo`` that answers those two calls the way the
real module does outside a compiled region. Anything else asked of it (``torch.compile``, ``optimize``,
``OptimizedModule``, a submodule import) loads the real module first, in its place: from then on torch and
everyone else see only the real one, and the markers handed out are dropped so torch makes its own. So a
compiled model or step is traced exactly as torch intends; what never compiles never pays for the import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any, Callable

NAME = "torch._dynamo"
CACHE = "__dynamo_disable"  # the attribute torch._compile._disable_dynamo caches its marker under

_lock = threading.RLock()
_marked: list[Callable[..., Any]] = []  # functions our markers were cached on: torch re-marks them once real


def _real() -> types.ModuleType:
    """The real ``torch._dynamo``, imported now if the stand-in still holds its place."""
    with _lock:
        current = sys.modules.get(NAME)
        if isinstance(current, _StandIn):
            del sys.modules[NAME]
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
            real = importlib.import_module(NAME)  # (the import sets torch._dynamo to it too)
            current.__dict__.update(graph_break=real.graph_break, disable=real.disable)  # for holders of the stand-in
            for fn in _marked:
                fn.__dict__.pop(CACHE, None)
            _marked.clear()
            return real
        return current if current is not None else importlib.import_module(NAME)


def _disable(fn: Callable[..., Any] | None = None, recursive: bool = True, **kwargs: Any) -> Any:
    """``torch._dynamo.disable`` outside a compiled region: a function that calls ``fn`` as it is; once the real
    module is in, the real marker (torch caches it on ``fn``; ours is dropped then)."""
    if fn is None:
        return lambda f: _disable(f, recursive, **kwargs)
    with _lock:
        if not isinstance(sys.modules.get(NAME), _StandIn):
            return _real().disable(fn, recursive, **kwargs)
        _marked.append(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        if isinstance(sys.modules.get(NAME), _StandIn):
            return fn(*args, **kw)
        return _real().disable(fn, recursive, **kwargs)(*args, **kw)

    return call


def _graph_break(msg: str = "") -> None:
    """``torch._dynamo.graph_break`` outside a compiled region (the real one's body is empty too)."""


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        return getattr(_real(), name)


class _Finder(importlib.abc.MetaPathFinder):
    """A submodule of ``torch._dynamo`` imported while the stand-in holds its place: the real package first (it
    imports most of them), so no submodule is ever loaded twice."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(NAME + ".") or not isinstance(sys.modules.get(NAME), _StandIn):
            return None
        _real()
        module = sys.modules.get(fullname)
        if module is None:
            return None  # not among those the package imports: the usual finders load it, once
        return importlib.machinery.ModuleSpec(fullname, _Loaded(module), is_package=hasattr(module, "__path__"))


class _Loaded(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: Any) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def defer_dynamo_import() -> bool:
    """Stand in for ``torch._dynamo`` until something needs more of it than eager training; idempotent. False
    where the real module is in already (something compiles)."""
    import torch

    with _lock:
        if NAME in sys.modules:
            return isinstance(sys.modules[NAME], _StandIn)
        spec = importlib.machinery.PathFinder.find_spec(NAME, list(torch.__path__))
        if spec is None:
            return False
        stand_in = _StandIn(NAME, __doc__)
        stand_in.__dict__.update(__spec__=spec, __path__=list(spec.submodule_search_locations or []),
                                 __file__=spec.origin, __package__=NAME, graph_break=_graph_break, disable=_disable)
        sys.meta_path.insert(0, _Finder())
        sys.modules[NAME] = stand_in
        torch._dynamo = stand_in  # type: ignore[attr-defined]  # (else each access goes through torch.__getattr__)
        return True

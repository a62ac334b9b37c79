"""Thrifty: train models the cheap, safe way. The library here imports no Prefect and touches no network at import.

Its rooms, bottom up (a module imports its own layer and those below, never above; tests/test_architecture.py):
``protocol``, ``procs``, ``faults``, ``numbers`` (what node and launcher agree on; process liveness; crash-test points;
how numbers read) ->
``config``, ``storage`` -> ``runs`` (what a run leaves in the store) -> ``money`` (prices, estimate, ledger,
meter, budget, savings) -> ``spot`` (preemptions, Young/Daly, the simulator), ``report`` (charts) ->
``launchers``, ``archive``, ``usercode`` (script mode, scaffolds) -> ``sweep``, ``results`` -> ``session``
(the users' facade for their own scripts), ``cli``.
"""

__version__ = "0.1.0"

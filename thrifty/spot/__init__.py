"""Spot: how often instances are preempted, the checkpoint interval that answers it (Young/Daly), the simulator, and
the deadline policy.

``preemption`` (statistics from the store's ledgers or the shipped traces), ``daly`` (closed forms),
``simulate`` (+ ``simulate_inputs``, ``simulate_report``: ``thrifty simulate``); ``deadline`` (spot or on-demand to
meet a deadline: the policies), ``deadline_run`` (a run's deadline record and measurements), ``traces`` (availability
traces: files, synthetic), ``deadline_sim`` (+ ``deadline_inputs``, ``deadline_options``, ``deadline_report``:
``thrifty simulate --deadline-h``). May import ``thrifty.money``, ``thrifty.report`` and everything below them; never a
launcher, torch or Prefect.
"""

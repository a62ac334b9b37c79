"""Spot: how often instances are preempted, the checkpoint interval that answers it (Young/Daly), and the simulator.

``preemption`` (statistics from the store's ledgers or the shipped traces), ``daly`` (closed forms),
``simulate`` (+ ``simulate_inputs``, ``simulate_report``: ``thrifty simulate``). May import ``thrifty.money``
and everything below it; never a launcher, torch or Prefect.
"""

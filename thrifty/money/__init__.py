"""Money: prices, the pre-launch estimate, measured speeds, the cost ledger, the node's meter, budget arithmetic, savings.

``pricing`` (the offline table: $/hour and $/GB-month, dated), ``prices`` (today's prices from the clouds' own
sources, cached in the store, the table last), ``throughput`` (speeds per accelerator), ``estimate`` (the gate),
``ledger`` (what every attempt cost), ``meter`` (the node's own cap), ``budget`` (spend, burn, stop
decisions), ``savings`` (actual against the naive way). May import ``thrifty.runs``, ``thrifty.storage``,
``thrifty.config`` and the base modules (``protocol``, ``procs``, ``faults``); never a launcher, torch or Prefect.
"""

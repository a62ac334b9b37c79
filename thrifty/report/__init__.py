"""Report: how a run's figures are said and drawn for people, from one place each: ``figures`` (spend, the savings
headline, early stopping's line, each lever's basis), ``ends`` (how a run ended, in the one sentence every surface
uses), ``chart`` (loss and spend as an SVG). Pure functions of records already read (``figures.run_spend_usd`` reads
the ledger); may import ``thrifty.money`` and ``thrifty.runs``, never a launcher, torch or Prefect.
"""

"""Report: how a run's figures are drawn for people (``chart``: loss and spend as an SVG). Pure functions of
records already read; may import ``thrifty.money`` and ``thrifty.runs``, never a launcher, torch or Prefect.
"""

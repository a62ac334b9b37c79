"""The training program a node runs (``python -m training``): loop, checkpoints, data cache, smoke test, recipes.

Imports thrifty, never Prefect. Importing the package itself is cheap: torch loads with the modules that need it.
"""

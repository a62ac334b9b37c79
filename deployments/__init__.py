"""Prefect deployments of thrifty's flows: the work pool, `prefect deploy` of prefect.yaml, the automations, and the
upcoming runs' names (``upcoming``, which the flows use too). Imports the library only, never the flows."""

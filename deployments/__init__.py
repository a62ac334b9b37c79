"""Prefect deployments of thrifty's flows: the work pool, `prefect deploy` of prefect.yaml, and (later) automations."""

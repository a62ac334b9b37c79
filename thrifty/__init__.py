"""Thrifty: train models the cheap, safe way. The library here imports no Prefect and touches no network at import."""

__version__ = "0.1.0"

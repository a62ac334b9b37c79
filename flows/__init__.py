"""Prefect flows that read like the pipeline."""

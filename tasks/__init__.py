"""Prefect tasks, one side effect each: preprocess, smoke, launch (and watch), report."""

"""Runs: what a run leaves in the store, and how to read it back.

``records`` (where things live, the summary, metric lines: re-exported here), ``checkpoints`` (names, commit
records, the best one), ``lease`` (one run, one job), ``shards`` (the preprocessing cache's manifests). May
import ``thrifty.storage``, ``thrifty.config`` and the base modules only: money and everything above read runs.
"""

from thrifty.runs.records import (BestMetric, RunSummary, finished_since, finished_summary, latest_progress,
                                  reached_end, read_jsonl, read_metrics, read_summary, run_key, summary_best_step,
                                  write_summary)

__all__ = ["BestMetric", "RunSummary", "finished_since", "finished_summary", "latest_progress", "reached_end",
           "read_jsonl", "read_metrics", "read_summary", "run_key", "summary_best_step", "write_summary"]

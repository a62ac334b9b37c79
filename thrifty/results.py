"""What the pipeline's steps hand each other: small frozen models instead of dicts with string keys.

``PrepResult`` (preprocess) -> ``SmokeResult`` (smoke test) -> ``Estimate`` (budget gate, in
``thrifty.money.budget``) -> ``JobOutcome`` (launch and watch) -> ``PipelineResult`` (the flow's return,
which ``thrifty run`` prints).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from thrifty.money.estimate import Estimate
from thrifty.money.ledger import Attempt
from thrifty.runs import RunSummary
from thrifty.money.savings import SavingsReport


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PrepResult(_Result):
    """The preprocessing cache entry a run trains on."""

    key: str
    hit: bool  # the shards were already in the store (or Prefect's cache said so)
    seconds: float  # this call's time
    cold_seconds: float  # what preprocessing costs without the cache
    examples: dict[str, int]  # examples per split
    bytes: int  # shard bytes in the store
    note: str = ""  # why there is no cache entry (script mode reads its own data)
    dedup: str = ""  # data.dedup and what it removed ("exact: 12 duplicates removed ..."), as the manifest says

    @classmethod
    def none(cls, why: str) -> "PrepResult":
        """No preprocessing step (script mode): an empty entry that says why."""
        return cls(key="", hit=False, seconds=0.0, cold_seconds=0.0, examples={}, bytes=0, note=why)


class SmokeResult(_Result):
    """What the CPU smoke test measured."""

    recipe: str
    steps: int
    losses: list[float]
    cpu_step_time_s: float  # the median step after the first (which pays for lazy initialisation)
    cpu_eval_s: float = 0.0  # a whole evaluation of every eval split on CPU (0: not measured, e.g. script mode)
    cpu_save_s: float = 0.0  # one checkpoint save on CPU
    examples_per_step: int | None  # None: a script that did not say (sess.describe); the gate then counts in its steps
    parameters: int | None  # None: a script that did not say
    precision_checked: str
    cache_key: str
    metrics_checked: list[str] = []  # every metric an evaluation reports, produced once on every eval split
    total_steps: int | None = None  # the run's length as the script reported it (script mode)


class JobOutcome(_Result):
    """How one launched job ended, with the ledger rows of its attempts."""

    job_id: str
    state: str  # the launcher's final JobState
    end: Literal["succeeded", "budget", "failed", "cancelled"]  # budget: stopped at the cap, by the watcher or itself
    message: str = ""
    attempts: list[Attempt]
    summary: RunSummary | None = None  # written by this job (a finished run)
    checkpoint_step: int | None = None  # the newest complete checkpoint when the job ended
    run_spend_usd: float = 0.0  # every job of the run, this one included
    reattached: bool = False  # watched a job an earlier flow run had started

    @property
    def preemptions(self) -> int:
        return sum(1 for a in self.attempts if a.end_reason == "preempted")


class PipelineResult(_Result):
    """The train flow's return value."""

    run_name: str
    cache_hit: bool
    already_finished: bool = False  # nothing launched: the run had finished with this config
    smoke: SmokeResult | None = None
    estimate: Estimate | None = None
    job: JobOutcome | None = None
    summary: RunSummary | None = None
    cost_usd: float  # every job of the run
    on_demand_usd: float | None = None
    savings: SavingsReport | None = None

"""Early stopping on a validation metric, with state that survives a resume; and the run's best, which it tracks.

An evaluation that is a new best is saved at once (the loop, a script's ``should_save``, the Lightning callback),
so the best metric always names weights that exist: ``BestMetric.checkpoint_step == BestMetric.step``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Literal

from thrifty.runs import BestMetric
from thrifty.runs.checkpoints import CheckpointInfo


@dataclass
class EarlyStopping:
    mode: Literal["min", "max"] = "min"
    patience: int = 3  # evaluations without improvement before stopping
    min_delta: float = 0.0  # smallest change that counts as an improvement
    enabled: bool = True
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    stopped: bool = False

    def improves(self, value: float) -> bool:
        if self.best is None:
            return not math.isnan(value)
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, step: int) -> bool:
        """Record one evaluation; True if it is the new best. Sets ``stopped`` when patience runs out."""
        if self.improves(value):
            self.best, self.best_step, self.bad_evals = float(value), step, 0
            return True
        self.bad_evals += 1
        if self.enabled and self.bad_evals >= self.patience:
            self.stopped = True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in ("best", "best_step", "bad_evals", "stopped")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.best_step = state["best_step"]
        self.bad_evals = int(state["bad_evals"])
        self.stopped = bool(state["stopped"])


def best_metric_at(stopper: EarlyStopping, step: int) -> float | None:
    """The metric a checkpoint of ``step`` records in its COMMIT: the new best those weights scored, else None (so
    retention's "best" and the early stopper's are the same checkpoint, whatever ``min_delta`` is)."""
    return stopper.best if stopper.best_step == step and stopper.best is not None else None


def best_metric(name: str, stopper: EarlyStopping, committed: Iterable[CheckpointInfo]) -> BestMetric:
    """The run's best evaluation and the checkpoint that holds those weights (None when none was saved at its step:
    a script that did not save when ``should_save`` said so)."""
    saved = stopper.best_step is not None and any(c.step == stopper.best_step for c in committed)
    return BestMetric(name=name, value=stopper.best, step=stopper.best_step,
                      checkpoint_step=stopper.best_step if saved else None)

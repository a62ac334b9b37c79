"""Early stopping on a validation metric, with state that survives a resume."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal


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

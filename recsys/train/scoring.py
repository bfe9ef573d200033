"""A run's score: its best validation report, and early stopping on it.

Every report carries ``best_<monitor>`` (the best value so far), ``best_step`` (where it came
from) and ``ckpt_score`` (this report's value: Ray Train keeps the best checkpoints by it).
A report without validation (or a NaN one) scores ``WORST[mode]``, a finite number below every
real value: Ray Train V2 persists the scores as JSON, where a NaN comes back as ``None`` after a
resume and then breaks its ordering (``float * None``). ``patience`` reports with validation that
do not improve on the best stop the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from recsys.config import TrainConfig
from recsys.distributed.checkpoint import TrainState

WORST = {"max": -1e300, "min": 1e300}  # finite: survives Ray's JSON snapshot of the scores


@dataclass(frozen=True)
class Scorer:
    monitor: str
    mode: str
    patience: int = 0

    @classmethod
    def of(cls, cfg: TrainConfig) -> Scorer:
        return cls(cfg.monitor, cfg.monitor_mode, cfg.patience)

    @property
    def best_key(self) -> str:
        return f"best_{self.monitor}"

    def better(self, value: float, best: float) -> bool:
        if not math.isfinite(value):
            return False
        if math.isnan(best):
            return True
        return value > best if self.mode == "max" else value < best

    def update(self, state: TrainState, metrics: dict[str, Any]) -> dict[str, float]:
        """Fold this report into ``state`` (in place); the score keys the report carries."""
        value = metrics.get(self.monitor)
        if value is not None:
            if self.better(float(value), state.best):
                state.best, state.best_step, state.stale = float(value), state.step, 0
            else:
                state.stale += 1
        return {
            self.best_key: state.best,
            "best_step": float(state.best_step),
            "ckpt_score": self.checkpoint_score(value),
        }

    def checkpoint_score(self, value: Any) -> float:
        """``value``, or the worst score of the mode where there is none (or it is not finite)."""
        if value is None or not math.isfinite(float(value)):
            return WORST[self.mode]
        return float(value)

    def should_stop(self, state: TrainState) -> bool:
        return self.patience > 0 and state.stale >= self.patience

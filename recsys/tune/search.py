"""The searcher: Ray Tune's ``OptunaSearch`` and what this product adds to it.

What Ray Tune 2.60's Optuna integration does: one or several objectives (``metric`` and ``mode``
as lists; Optuna's ``TPESampler`` handles both), fed from each trial's *last* result (intermediate
results are not reported for several objectives). What it does not do, added here:

- The score is the best validation report, not the last: the workers report ``best_<metric>``
  in every result, so the last result holds the best (``recsys.train.scoring``).
- Infeasible configurations (over the space's budget, or no sharding plan fits the workers) are
  not trained; Optuna is told they violate a constraint (``constraints_func`` on the sampler, from
  a user attribute set here), so the sampler learns to avoid them, instead of the trial failing.
- A trial without a score (it diverged before its first validation, or errored) is told to Optuna
  as failed, instead of raising inside ``study.tell`` on a NaN.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune.search.optuna import OptunaSearch

CONSTRAINT = "recsys_constraint"
INFEASIBLE = "infeasible"


def _violation(trial: Any) -> list[float]:
    return list(trial.user_attrs.get(CONSTRAINT, [0.0]))


def make_sampler(seed: int) -> Any:
    """Optuna's TPE, aware of infeasible trials (feasible first; violations ranked last)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study and trial
    return optuna.samplers.TPESampler(seed=seed, constraints_func=_violation)


class ConstrainedOptunaSearch(OptunaSearch):  # type: ignore[misc]
    """``OptunaSearch`` over one or several objectives, with infeasible trials as constraint
    violations. ``worst``: a finite stand-in per objective for an infeasible trial (Optuna needs
    values to complete a trial; with a violation they do not rank it)."""

    def __init__(self, *, worst: dict[str, float], seed: int, **kwargs: Any) -> None:
        super().__init__(sampler=make_sampler(seed), **kwargs)
        self.worst = worst

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        ot_trial = self._ot_trials.get(trial_id)  # the integration's own trial handles
        if ot_trial is None or not result:
            return super().on_trial_complete(trial_id, result, error)
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        infeasible = bool(result.get(INFEASIBLE))
        ot_trial.set_user_attr(CONSTRAINT, [1.0 if infeasible else 0.0])
        missing = [m for m in metrics if not _finite(result.get(m))]
        if infeasible:
            result = {**result, **{m: self.worst[m] for m in missing}}
        elif missing:
            return super().on_trial_complete(trial_id, None, error=True)  # no score: failed
        return super().on_trial_complete(trial_id, result, error)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

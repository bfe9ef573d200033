"""The searcher: Ray Tune's ``OptunaSearch`` and what this product adds to it.

What Ray Tune 2.60's Optuna integration does: one or several objectives (``metric`` and ``mode``
as lists; Optuna's ``TPESampler`` handles both), fed from each trial's *last* result (intermediate
results are not reported for several objectives). What it does not do, added here:

- The score is the best validation report, not the last: the workers report ``best_<metric>``
  in every result, so the last result holds the best (``recsys.train.scoring``).
- Infeasible configurations (over the space's budget, or no sharding plan fits the workers) are
  not trained; Optuna is told they violate a constraint (``Trial.set_constraint``, which TPE reads
  from each trial), so the sampler learns to avoid them, instead of the trial failing.
- A trial without a score (it diverged before its first validation, or errored) is told to Optuna
  as failed, instead of raising inside ``study.tell`` on a NaN.
- A trial the scheduler stopped before its budget (ASHA, or Hyperband: ASHA's brackets) is told
  to Optuna as *pruned*, not complete (one objective): its TPE then ranks it by how far it got
  and its last reported score, below the trials that ran their budget, as Optuna's own pairing
  of TPE with its Hyperband pruner does, instead of taking a low-budget score as final.
- A grown sweep's searcher (``recsys-sweep --more``) starts from the earlier trials: each is
  added to its study as a finished (or pruned) trial with its params, scores and constraint
  (``warm``), for one or several objectives (Ray's ``evaluated_rewards`` takes one).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np
from ray.tune.result import TRAINING_ITERATION
from ray.tune.search.optuna import OptunaSearch

CONSTRAINT = "recsys_constraint"
INFEASIBLE = "infeasible"
# the system attribute of a trial's constraint, as ``Trial.set_constraint(INFEASIBLE, v)`` sets it
# and Optuna's samplers read it (a trial is feasible when every constraint is at most 0)
OPTUNA_CONSTRAINT = f"constraints:{INFEASIBLE}"
# Optuna's note on a categorical choice that is not a plain value (a list, as ``loss.weights``
# takes): such a study cannot go into an RDB storage; a Tune searcher's study lives in memory
# and is saved by pickling, so the note says nothing to the user
CATEGORICAL_NOTE = "Choices for a categorical distribution should be a tuple of None"


def _violation(trial: Any) -> list[float]:
    """The constraint function of the samplers that earlier versions pickled into a sweep's
    searcher state (``constraints_func``): a sweep saved by one of them resumes with it."""
    return list(trial.user_attrs.get(CONSTRAINT, [0.0]))


def make_sampler(seed: int) -> Any:
    """Optuna's TPE, aware of infeasible trials (feasible first; violations ranked last: TPE reads
    each trial's constraints, set as it is told)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per study and trial
    return optuna.samplers.TPESampler(seed=seed)


class WarmPoint(NamedTuple):
    """An earlier trial told to a new searcher: its params (the space's keys), its score per
    objective, whether it was infeasible, and the step of its score where the scheduler
    stopped it before its budget (None: it ran its course)."""

    params: dict[str, Any]
    values: list[float]
    infeasible: bool
    pruned_at: int | None = None


class ConstrainedOptunaSearch(OptunaSearch):  # type: ignore[misc]
    """``OptunaSearch`` over one or several objectives, with infeasible trials as constraint
    violations. ``worst``: a finite stand-in per objective for an infeasible trial (Optuna needs
    values to complete a trial; with a violation they do not rank it). ``warm``: earlier
    trials, added to the study before it samples."""

    def __init__(
        self,
        *,
        worst: dict[str, float],
        seed: int,
        warm: list[WarmPoint] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sampler=make_sampler(seed), **kwargs)
        self.worst = worst
        self.warm = list(warm or [])

    @staticmethod
    def convert_search_space(spec: dict[str, Any]) -> dict[str, Any]:
        """Ray's conversion of a Tune space to Optuna's distributions, without ``CATEGORICAL_NOTE``
        (printed once per list-valued choice on every sweep's console)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=CATEGORICAL_NOTE)
            return dict(OptunaSearch.convert_search_space(spec))

    def _setup_study(self, mode: Any) -> None:
        super()._setup_study(mode)
        study: Any = self._ot_study
        for point in self.warm:
            study.add_trial(told(point, self._space))

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An intermediate score told at the trial's training step (Ray tells the report's
        index), the scale a grown sweep's earlier pruned trials are told at."""
        if "step" in result and finite(result["step"]):
            result = {**result, TRAINING_ITERATION: int(result["step"])}
        super().on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        ot_trial = self._ot_trials.get(trial_id)  # the integration's own trial handles
        if ot_trial is None or not result:
            return super().on_trial_complete(trial_id, result, error)
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        infeasible = bool(result.get(INFEASIBLE))
        violation = 1.0 if infeasible else 0.0
        ot_trial.set_user_attr(CONSTRAINT, [violation])  # what a resumed old sampler reads
        ot_trial.set_constraint(INFEASIBLE, violation)
        missing = [m for m in metrics if not finite(result.get(m))]
        if infeasible:
            result = {**result, **{m: self.worst[m] for m in missing}}
        elif missing:
            return super().on_trial_complete(trial_id, None, error=True)  # no score: failed
        elif len(metrics) == 1 and stopped_early(result):
            return super().on_trial_complete(trial_id, None, error=False)  # told as pruned
        return super().on_trial_complete(trial_id, result, error)


def told(point: WarmPoint, space: Any) -> Any:
    """``point`` as a finished Optuna trial over ``space`` (a Tune space as Optuna's
    distributions by flat key): complete with its scores, or (one objective) pruned at its
    step."""
    import optuna

    flat = {f"params/{k}": v for k, v in point.params.items()}
    dists = {k: d for k, d in space.items() if k in flat}
    at = point.pruned_at if len(point.values) == 1 else None
    violation = 1.0 if point.infeasible else 0.0
    state = optuna.trial.TrialState
    return optuna.trial.create_trial(
        params={k: _native(flat[k]) for k in dists},
        distributions=dists,
        values=point.values if at is None else None,
        state=state.COMPLETE if at is None else state.PRUNED,
        intermediate_values=None if at is None else {at: point.values[0]},
        user_attrs={CONSTRAINT: [violation]},
        system_attrs={OPTUNA_CONSTRAINT: violation},  # as ``set_constraint`` sets it
    )


def stopped_early(result: dict[str, Any]) -> bool:
    """Whether a trial's last report is from before its budget's last step, and not by its own
    rule (patience, divergence): the scheduler stopped it."""
    step, own = result.get("step"), result.get("train_steps")
    if result.get("early_stopped") or result.get("diverged"):
        return False
    return finite(step) and finite(own) and float(step) < float(own)  # type: ignore[arg-type]


def finite(value: Any) -> bool:
    """A number (Python's or NumPy's) that is neither NaN nor infinite."""
    return isinstance(value, (int, float, np.number)) and math.isfinite(float(value))


def _native(value: Any) -> Any:
    """A NumPy scalar (read back from a results frame) as the Python value Optuna compares."""
    return value.item() if hasattr(value, "item") else value

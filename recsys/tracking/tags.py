"""Every MLflow tag name this project writes or searches by, in one place (``Tag``)."""


class Tag:
    """Every MLflow tag name this project writes or searches by, in one place."""

    SWEEP = "recsys.sweep"  # the sweep a run belongs to
    TRIAL = "recsys.trial_id"  # a trial run: the Tune trial id (a halved reference's: its point's)
    KIND = "recsys.kind"  # trial, baseline, confirm, refit; "sweep:<name>" on a sweep's parent
    CONFIRMS = "recsys.confirms"  # a seed-check run: the trial whose configuration it re-trains
    CONFIRMED_ORDER = "recsys.confirmed_order"  # on the parent: trial ids by confirmed mean, JSON
    SEPARABLE = "recsys.separable"  # on the parent: "yes" if the top two's lead exceeds the noise
    STATUS = "recsys.status"  # finished, early_stopped, stopped, diverged, infeasible
    STATUS_DETAIL = "recsys.status_detail"  # why (an infeasible trial's numbers)
    METRIC = "recsys.metric"  # on a sweep's parent run: the metric that scores its trials
    MODE = "recsys.mode"  # ... and whether higher ("max") or lower is better
    BEST_TRIAL = "recsys.best_trial"  # on a sweep's parent run: its best trial's id
    WINNER = "recsys.winner"  # on a sweep's parent run: its best model, whatever its kind
    WINNER_TRIAL = "recsys.winner_trial"  # ... its trial id (a search trial's or a reference's)
    WINNER_KIND = "recsys.winner_kind"  # ... "search" or "reference"
    SEARCHED = "recsys.searched"  # the sampled params of a trial, as JSON
    REFERENCE = "recsys.reference"  # a baseline's run: "best of N: ..." (chosen) or "candidate";
    # on the parent, + ".<arch>": that arch's chosen reference trial
    CHAMPION = "recsys.champion"  # a model version: "yes", "no: <why>", or "was: <moved>"
    VERDICT = "recsys.verdict"  # on the parent, + ".<arch>": beats / ties / does not beat, lead
    REFIT_OF = "recsys.refit_of"  # a refit's run (kind "refit"): the trial it trains again
    REFIT_ROWS = "recsys.refit_rows"  # ... and the rows it trained on
    PARENT_VERSION = "recsys.parent_version"  # a retrain's version (and its retrain's run): the
    # registered version whose retrain made it (warm-started from it, or from scratch beside it)
    PARENT_DATA = "recsys.parent_data"  # ... that version's data (the earlier period)
    DATA = "recsys.data"  # ... the period it was retrained on
    START = "recsys.start"  # ... "warm" (from its parent's checkpoint) or "scratch" (the pick)
    DECISION = "recsys.decision"  # on a retrain's run: promoted, or kept and why
    REGISTERED_VERSION = "recsys.registered_version"  # ... the version the retrain registered
    RESUME_NOTE = "recsys.resume_note"  # what a resume on another worker count could not keep
    EDGE = "recsys.edge"  # on the parent, + ".<key>": the best trials pressed against its range
    EARLY_PEAKS = "recsys.early_peaks"  # on the parent: most trials peaked in their first tenth
    BEST_CHECKPOINT = "checkpoint.best"
    LAST_CHECKPOINT = "checkpoint.last"
    PARENT = "mlflow.parentRunId"  # MLflow's own: nests trial runs under the sweep's run
    NOTE = "mlflow.note.content"  # MLflow's own: a run's description (on the sweep's run)
    EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow 3's, on an experiment: what it is for
    VIEW = "mlflow.sharedViewState."  # the MLflow UI's, on an experiment: a saved view, + its key

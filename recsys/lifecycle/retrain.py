"""Retrain the champion on a later period, and promote it only on a real win (``recsys-retrain``).

A recommender's log never ends: each period brings new rows, new users and new items, prepared
with the earlier period's vocabularies (``recsys-preprocess --like``). The registered model's
configuration is trained further on the new period, warm-started from its checkpoint
(``train.init_from``: tables, dense weights, optimizer state; rows a grown vocabulary added
initialised), and the same configuration from scratch beside it, ``--seeds`` times each, every
training a run on Ray Train, or in a Ray task for one CPU worker (the address rules, workers and
resume of ``recsys-train``: re-running the command resumes the unfinished ones and trains the
finished no more), ``--max-concurrent`` at once. What is trained, and every refusal before it:
``recsys.lifecycle.plan``. On the new period's test rows (the split its folder defines), the
frozen champion is scored first (``recsys.lifecycle.frozen``), then each training.

The pick (``pick``): the retrain offers the warm start, unless the models from scratch scored
better on the new period's validation rows (their seeds' means; a tie keeps the warm start). When
the tastes have moved far, the weights of the earlier periods can hold a model back, and the
from-scratch models, trained anyway as the bar, are then the better offer. The test rows take no
part in the pick: they decide against the frozen champion.

The decision (``decide``): the picked model wins where the frozen score lies outside the 95%
interval of its seeds' mean, on the metric's better side (``recsys.tune.confirm``), and the seed
that is registered (the one nearest the mean) beats the frozen score too. Its version is
registered with its lineage (``recsys.parent_version``, ``recsys.parent_data``, ``recsys.data``,
``recsys.start``: warm or scratch) and gets ``@champion`` only on a win, and only where the alias
still names the version this retrain started from (or one it registered itself: a re-run's) or
the model has no ``@champion`` yet (a retrain of another version, or one the alias moved away
from meanwhile, moves nothing and says so). Otherwise: ``kept @champion (version K): lead +x
inside the noise`` (or ``lead -x outside the noise, behind it``). The warm start's lead or lag on
the from-scratch models is said and logged. Everything lands in MLflow under one parent run per
retrain (experiment ``retrain-<NAME>``).

The refit (``--refit``, ``refit_seed``): what serves the next period learns most from recent
rows, and the pick held the validation rows out. The seed that would be registered is trained
again on the new period's training and validation rows (the same epochs of those rows, from the
same start), in an MLflow run of its own (``recsys.kind = refit``), and registered in its place.
The seeds still measure the noise and decide; in the rule the refit takes the registered seed's
place: it, scored on the test rows (the newest, never trained on), must beat the frozen score.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recsys.config import ExperimentConfig
from recsys.lifecycle.plan import ROLES, Plan
from recsys.tracking.tags import Tag
from recsys.tracking.tracker import Tracker, flat_params
from recsys.train.ray_trainer import Resources

CHAMPION = "champion"


LABELS = {"retrained": "retrained", "scratch": "from scratch"}  # a role, as the lines say it


@dataclass(frozen=True)
class Pick:
    """The model a retrain offers, ``retrained`` (the warm start) or ``scratch``, and the line
    that says why."""

    role: str
    line: str


def pick(plan: Plan, val: dict[str, list[float]]) -> Pick:
    """The module's pick: the warm start, unless the models from scratch have the better mean
    ``val_<metric>`` over their seeds (``val``: each role's, seed by seed). Without a validation
    score for every training (a folder with no validation rows), the warm start."""
    metric = f"val_{plan.metric}"
    if any(math.isnan(v) for vs in val.values() for v in vs):
        return Pick("retrained", f"picked the warm start: not every training has a {metric} "
                                 "(the new period's validation rows pick)")  # fmt: skip
    warm, cold = (sum(val[r]) / len(val[r]) for r in ROLES)
    sign = 1.0 if plan.mode == "max" else -1.0
    d = digits(warm, cold)
    means = f"{metric} seed means: warm start {warm:.{d}f}, from scratch {cold:.{d}f}"
    if sign * (cold - warm) > 0:
        return Pick("scratch", f"picked the model from scratch: the warm start trails it ({means})")
    return Pick("retrained", f"picked the warm start ({means})")


def digits(a: float, b: float, least: int = 4, most: int = 8) -> int:
    """The decimals that show ``a`` and ``b`` apart (``least`` where they differ there already,
    or are equal; at most ``most``): a line that says one trails the other shows by how much."""
    d = least
    while a != b and d < most and f"{a:.{d}f}" == f"{b:.{d}f}":
        d += 1
    return d


@dataclass(frozen=True)
class Decision:
    """Whether the picked model is promoted, the seed registered, and the line that says why."""

    promote: bool
    seed: int  # the picked role's seed registered (1-based)
    line: str
    role: str = "retrained"  # the picked role (``pick``)


def nearest(scores: list[float]) -> int:
    """The seed (1-based) whose score is nearest the seeds' mean: the one registered."""
    mean = sum(scores) / len(scores)
    return 1 + min(range(len(scores)), key=lambda i: abs(scores[i] - mean))


def decide(plan: Plan, scores: list[float], frozen: float, champion: str,
           role: str = "retrained", refit: float | None = None) -> Decision:  # fmt: skip
    """The module's rule: the frozen score outside the 95% interval of the picked ``role``'s
    seeds (``scores``), on the better side, and the registered model better than it: the seed
    nearest the mean (``nearest``), or its refit (``refit``: its test score). ``champion``: the
    version ``@champion`` names now, for the line."""
    from recsys.tune.confirm import LEVEL, spread

    s = spread(role, scores)
    sign = 1.0 if plan.mode == "max" else -1.0
    lead = sign * (s.mean - frozen)
    seed = nearest(scores)
    mine = scores[seed - 1] if refit is None else refit
    model = f"seed {seed}" if refit is None else f"seed {seed}'s refit"
    outside = (s.low > frozen) if plan.mode == "max" else (s.high < frozen)
    metric = f"test_{plan.metric}"
    d = max(digits(v, frozen) for v in (s.mean, mine, s.low, s.high))  # what decides, shown
    interval = f"{LEVEL:.0%} CI [{s.low:.{d}f}, {s.high:.{d}f}] of {len(scores)} seeds"
    exact = "; the seeds agree exactly: no seed noise measured" if s.std == 0 else ""
    if outside and sign * (mine - frozen) > 0:
        line = (f"{LABELS[role]} {metric} {s.mean:.{d}f} ({interval}) against the frozen "
                f"version {plan.version}'s {frozen:.{d}f}: lead {lead:+.{d}f}, outside the "
                f"noise; {model} registered ({mine:.{d}f}){exact}")  # fmt: skip
        return Decision(True, seed, line, role)
    behind = (s.high < frozen) if plan.mode == "max" else (s.low > frozen)
    why = (
        "outside the noise, behind it" if behind
        else "inside the noise" if not outside
        else f"{model} not ahead ({mine:.{d}f})" if refit is not None
        else f"seed {seed}, nearest the mean, not ahead"
    )  # fmt: skip
    return Decision(
        False,
        seed,
        f"kept @{CHAMPION} (version {champion}): lead {lead:+.{d}f} {why} ({LABELS[role]} "
        f"{metric} {s.mean:.{d}f}, {interval}; frozen {frozen:.{d}f}){exact}",
        role,
    )


def scratch_line(plan: Plan, scores: dict[str, list[float]]) -> str:
    """The warm start against the models from scratch: its lead, and whether it is outside the
    seed noise (Welch's 95% interval of the difference, ``recsys.tune.confirm.separation``)."""
    from recsys.tune.confirm import separation, spread

    warm, cold = spread("retrained", scores["retrained"]), spread("scratch", scores["scratch"])
    sep = separation(warm, cold, plan.mode)
    d = digits(warm.mean, cold.mean)
    if warm.std == 0 and cold.std == 0:  # (a solved model: every seed the same)
        return (f"warm start against from scratch: lead {sep.lead:+.{d}f} (the seeds agree "
                f"exactly: no seed noise measured; from scratch {cold.mean:.{d}f})")  # fmt: skip
    where = "outside" if sep.low > 0 or sep.high < 0 else "inside"
    return (f"warm start against from scratch: lead {sep.lead:+.{d}f} (95% CI [{sep.low:+.{d}f}, "
            f"{sep.high:+.{d}f}], {where} the noise; from scratch {cold.mean:.{d}f})")  # fmt: skip


@dataclass
class Outcome:
    """A retrain's result: each training's test metric by role, the frozen champion's, the
    pick, the decision, the registered version, and the refit's test metric (``--refit``)."""

    scores: dict[str, list[float]]
    frozen: float
    decision: Decision
    picked: Pick
    version: str = ""
    lines: list[str] = field(default_factory=list)
    refit: float | None = None


@dataclass(frozen=True)
class Model:
    """A trained model the retrain may register: its trial (its MLflow run's), its checkpoint
    and configuration."""

    trial: str
    checkpoint: str
    cfg: ExperimentConfig


def run_retrain(
    plan: Plan, tracker: Tracker, resources: Resources, storage: str, out_dir: str,
    log: Callable[[str], None] = print, dtype: str = "int8", concurrent: int = 1,
) -> Outcome:  # fmt: skip
    """The frozen champion scored, every seed of both roles trained (Ray connected; each
    resumes where a run of this retrain left it; ``concurrent`` at a time, started seed by seed,
    each ``resources``' workers), the pick, the decision, the picked model registered and
    ``@champion`` moved where the decision and the alias allow; all under one MLflow parent
    run. After a training fails, no further one starts; those running end before its error is
    raised, and a re-run trains only what is left."""
    from recsys.lifecycle.frozen import score_frozen
    from recsys.runtime.lanes import in_lanes
    from recsys.runtime.storage import join as storage_join

    exp = tracker.experiment(f"retrain-{plan.name}")
    parent = tracker.parent_run(exp, plan.key, kind="retrain")
    tracker.set_tags(parent, {Tag.PARENT_VERSION: plan.version, Tag.DATA: plan.data})
    frozen_scores = score_frozen(plan.frozen, plan.checkpoint, plan.cfg)  # first: it is cheap
    frozen = frozen_scores.get(f"test_{plan.metric}", math.nan)
    log(f"frozen {plan.name} version {plan.version}: test_{plan.metric} {frozen:.4f}")
    folder = storage_join(storage, f"retrain-{plan.key}")
    trained: dict[tuple[str, int], tuple[float, float, str]] = {}  # (role, seed) -> test, val, ckpt

    def one(job: tuple[str, int]) -> None:
        role, seed = job
        mine = tracker if concurrent <= 1 else Tracker(tracker.uri)  # (a training's own)
        before = finished(mine, exp, f"{plan.key}.{role}-{seed}", plan.metric)  # not again
        metrics, ckpt, run_id = before or train_one(plan, role, seed, mine, exp, parent,
                                                    resources, folder)  # fmt: skip
        val = float(metrics.get(f"val_{plan.metric}", math.nan))
        trained[job] = (test_score(metrics, plan, role, seed), val, ckpt)
        again = ", trained before: not again" if before else ""
        log(f"{role} seed {seed}: test_{plan.metric} {trained[job][0]:.4f} (run {run_id}{again})")

    seeds = range(1, plan.seeds + 1)
    jobs = [(role, seed) for seed in seeds for role in ROLES]
    # several at once: every lane a thread of its own (the main thread only waits), and none
    # started after an error (one that fails them all, a bad folder, fails once)
    in_lanes(one, jobs, concurrent, name="retrain", caller=False, keep_going=False)
    scores = {r: [trained[(r, s)][0] for s in seeds] for r in ROLES}
    val = {r: [trained[(r, s)][1] for s in seeds] for r in ROLES}
    picked = pick(plan, val)
    role, seed = picked.role, nearest(scores[picked.role])
    model = Model(f"{plan.key}.{role}-{seed}", trained[(role, seed)][2], plan.config_of(role, seed))
    lines: list[str] = []

    def say(line: str) -> None:  # (each line as it is known, kept for the parent's tag)
        lines.append(line)
        log(line)

    say(scratch_line(plan, scores))
    say(picked.line)
    refit = None
    if plan.refit:
        model, refit, line = refit_seed(plan, tracker, exp, model, role, seed, resources, storage,
                                        log)  # fmt: skip
        say(line)
    decision = decide(plan, scores[role], frozen, current_champion(tracker, plan), role, refit)
    say(decision.line)
    outcome = Outcome(scores, frozen, decision, picked, lines=lines, refit=refit)
    outcome.version, alias = register(plan, tracker, exp, model, out_dir, decision, dtype)
    if alias:
        say(alias)
    summary = {f"{r}_{plan.metric}_mean": float(sum(v) / len(v)) for r, v in scores.items()}
    if refit is not None:
        summary[f"refit_{plan.metric}"] = refit
    tracker.log_values(parent, {**summary, **{f"frozen_{k.removeprefix('test_')}": v
                                              for k, v in frozen_scores.items()}})  # fmt: skip
    tracker.set_tags(parent, {Tag.DECISION: " ".join(outcome.lines),
                              Tag.REGISTERED_VERSION: outcome.version})  # fmt: skip
    tracker.finish(parent)
    return outcome


def test_score(metrics: dict[str, Any], plan: Plan, role: str, seed: int) -> float:
    """A training's ``test_<metric>``; a training that reported none is refused."""
    key = f"test_{plan.metric}"
    if key not in metrics:
        raise ValueError(f"the {role} training of seed {seed} reported no {key}")
    return float(metrics[key])


def current_champion(tracker: Tracker, plan: Plan) -> str:
    """The version ``@champion`` names now ("none" without the alias)."""
    try:
        return str(tracker.client.get_model_version_by_alias(plan.name, CHAMPION).version)
    except Exception:  # MlflowException: no such alias
        return "none"


def train_one(
    plan: Plan, role: str, seed: int, tracker: Tracker, exp: str, parent: str,
    resources: Resources, folder: str,
) -> tuple[dict[str, Any], str, str]:  # fmt: skip
    """One training (a run named ``<role>-seed<seed>`` in ``folder``, resumed where a run left it:
    on Ray Train, or in a Ray task for one CPU worker, ``recsys.train.launch``), its reports
    logged to its MLflow run; its last report, checkpoint, run id. (One a run finished is not
    trained again: ``run_retrain`` takes it from ``finished``.)"""
    import yaml

    from recsys.runtime.storage import join
    from recsys.tracking import inputs
    from recsys.train.launch import make_run
    from recsys.train.results import last_checkpoint

    cfg = plan.config_of(role, seed)
    trial = f"{plan.key}.{role}-{seed}"
    run_id = tracker.trial_run(exp, parent, plan.key, trial, flat_params(cfg.to_dict()),
                               kind=role, name=f"{role} seed {seed}")  # fmt: skip
    tracker.log_text(run_id, yaml.safe_dump(cfg.to_dict()), "config.yaml")
    tracker.log_dataset(run_id, lambda: inputs.describe(cfg.data))
    trainer = make_run(
        cfg,
        resources,
        name=f"{role}-seed{seed}",
        storage_path=folder,
        max_failures=2,
        report_to=(tracker.uri, run_id),
        tracker=tracker,  # (its finish below flushes what MLflow did not take yet)
    )
    result = trainer.fit()
    try:
        ckpt, metrics = last_checkpoint(result, join(folder, f"{role}-seed{seed}"))
    except RuntimeError:
        raise ValueError(f"the {role} training of seed {seed} left no checkpoint") from None
    if result.checkpoint is None:  # its last report, read from its checkpoint
        log_lost_scores(tracker, run_id, plan.metric, metrics)
    tracker.set_tags(run_id, {Tag.BEST_CHECKPOINT: ckpt, Tag.LAST_CHECKPOINT: ckpt})
    tracker.finish(run_id)
    if f"test_{plan.metric}" not in metrics:  # killed after its last report: it had none left
        metrics = end_scores(tracker, run_id, plan.metric)
    return metrics, ckpt, run_id


def log_lost_scores(tracker: Tracker, run_id: str, metric: str, report: dict[str, Any]) -> None:
    """Log ``report``'s test and validation scores at its step into ``run_id`` where the run has
    no test score (``end_scores``): a kill after the checkpoint, before the report reached
    MLflow. (The report of a resumed run with nothing left to train, which has none, may be
    there at the same step.)"""
    import time

    from mlflow.entities import Metric

    if end_scores(tracker, run_id, metric):
        return
    step, now = int(report.get("step", 0)), int(time.time() * 1000)
    numbers = {k: float(v) for k, v in report.items() if isinstance(v, (int, float)) and v == v}
    scores = [Metric(k, v, now, step) for k, v in numbers.items()
              if k.startswith(("test_", "val_"))]  # fmt: skip
    if scores:
        tracker.client.log_batch(run_id, scores)


def end_scores(tracker: Tracker, run_id: str, metric: str) -> dict[str, float]:
    """A training's ``test_<metric>`` and the ``val_<metric>`` of the same (last) report, from
    its MLflow run; {} without a test score. A validation score of an earlier report is left
    out (the last had none, or a NaN, which is never logged), as it is from the report
    itself."""
    test, val = (
        tracker.client.get_metric_history(run_id, f"{k}_{metric}") for k in ("test", "val")
    )
    if not test:
        return {}
    end = max(test, key=lambda m: m.step)
    same = [m.value for m in val if m.step == end.step]
    return {f"test_{metric}": end.value, **({f"val_{metric}": same[-1]} if same else {})}


def finished(tracker: Tracker, exp: str, trial: str, metric: str
             ) -> tuple[dict[str, Any], str, str] | None:  # fmt: skip
    """A training of this retrain that an earlier run finished (its MLflow run ``FINISHED``
    with its checkpoint and its test score): its scores (``end_scores``), checkpoint and run
    id; else None."""
    run = tracker.find_trial_run(exp, trial)
    if run is None or run.info.status != "FINISHED":
        return None
    ckpt = run.data.tags.get(Tag.BEST_CHECKPOINT)
    scores = end_scores(tracker, str(run.info.run_id), metric)
    if not ckpt or not scores:
        return None
    return scores, ckpt, str(run.info.run_id)


def refit_seed(
    plan: Plan, tracker: Tracker, exp: str, model: Model, role: str, seed: int,
    resources: Resources, storage: str, log: Callable[[str], None] = print,
) -> tuple[Model, float, str]:  # fmt: skip
    """``model``, the picked ``role``'s ``seed``, trained again on the new period's training and
    validation rows (``Plan.refit_of``; Ray connected): an MLflow run of its own beside the
    seed's (``recsys.kind = refit``, ``recsys.refit_of`` naming the seed's trial), its training
    ``<role>-seed<seed>-refit`` in the retrain's folder, resumed where a run left it (``log``
    says it starts), or found finished. The refit as a ``Model``, its test score, and the line
    that says it (and that it was trained before)."""
    from recsys.data.dataset import split_rows
    from recsys.tune.refit import Refit, open_refit_run, train_into

    cfg = plan.refit_of(role, seed)
    train, val = split_rows(cfg)
    trial = f"{model.trial}.refit"
    seed_run = tracker.find_trial_run(exp, model.trial)
    refit = Refit(str(seed_run.info.run_id), model.trial, cfg, cfg.train.epochs, train, val)
    if done := finished(tracker, exp, trial, plan.metric):  # a re-run trains it no more
        metrics, ckpt, _ = done
    else:
        log(f"refitting the pick ({LABELS[role]} seed {seed}) on the training and validation rows")
        name = f"{LABELS[role]} seed {seed} refit"
        run_id = open_refit_run(tracker, plan.key, refit, resources.num_workers, name=name)
        try:
            ckpt = train_into(tracker, run_id, refit, resources, storage, f"retrain-{plan.key}",
                              name=f"{role}-seed{seed}-refit")  # fmt: skip
            metrics = end_scores(tracker, run_id, plan.metric)
            test_score(metrics, plan, f"{role} refit", seed)  # (else not finished: run again)
        except BaseException:
            tracker.finish(run_id, "FAILED")
            raise
        tracker.finish(run_id)
    score = test_score(metrics, plan, f"{role} refit", seed)
    own = seed_run.data.metrics.get(f"test_{plan.metric}", math.nan)
    budget = ("solved to convergence" if cfg.train.solver == "lbfgs"
              else f"{cfg.train.epochs:.3g} epochs")  # fmt: skip
    line = (f"refitted {LABELS[role]} seed {seed} on {refit.rows_note}, {budget}: "
            f"test_{plan.metric} {score:.4f} (seed {seed}, trained without the validation rows: "
            f"{own:.4f}){', trained before: not again' if done else ''}")  # fmt: skip
    return Model(trial, ckpt, cfg), score, line


def blocked(decision: Decision, now: str, version: str, own: bool = False) -> str:
    """Why a promotion does not move ``@champion`` (which names ``now``, "none" without it)
    from ``version``, the one the retrain started from; "" where it moves: the alias still
    names ``version``, or the model has none yet (a version retrained by number), or ``own``:
    it names a version this retrain registered (a re-run's, or one without ``--refit``)."""
    if not decision.promote or own or now in (version, "none"):
        return ""
    return (
        f"not promoted: @{CHAMPION} names version {now}, not version {version} this "
        "retrain started from"
    )


def registered_here(tracker: Tracker, plan: Plan, version: str) -> bool:
    """Whether ``version`` of ``plan.name`` was registered by this retrain (its run one of the
    retrain's trainings, or their refit: ``Tag.SWEEP`` is the retrain's key)."""
    if version == "none":
        return False
    run_id = tracker.client.get_model_version(plan.name, version).run_id
    if not run_id:
        return False
    return bool(tracker.client.get_run(run_id).data.tags.get(Tag.SWEEP) == plan.key)


def register(
    plan: Plan, tracker: Tracker, exp: str, model: Model, out_dir: str, decision: Decision,
    dtype: str = "int8",
) -> tuple[str, str]:  # fmt: skip
    """Export ``model`` (the decision's seed of the picked role, or its refit) as a new version
    of ``plan.name`` with its lineage (a retrain run again finds its version and registers
    none), and move ``@champion`` to it where the decision promotes it and ``blocked`` finds
    nothing in the way (the alias still names ``plan.version`` or a version this retrain
    registered, or none is set). Its version, and a line where the decision promotes it: that
    the alias moved (``promoted``), or why not (``blocked``)."""
    from recsys.serving.mlflow_model import export_to_run, move_champion, newest_version

    run = tracker.find_trial_run(exp, model.trial)
    if run is None:
        raise ValueError(f"retrain {plan.key}: no MLflow run of {model.trial}")
    run_id, client = str(run.info.run_id), tracker.client
    if not any(v.run_id == run_id for v in client.search_model_versions(f"name = '{plan.name}'")):
        export_to_run(tracker, run_id, model.checkpoint, model.cfg, out_dir, dtype, plan.name)
    version = str(newest_version(tracker, plan.name, run_id))
    now = current_champion(tracker, plan)
    moved = blocked(decision, now, plan.version, registered_here(tracker, plan, now))
    said = "yes" if decision.promote and not moved else f"no: {moved or decision.line}"
    tags = {Tag.PARENT_VERSION: plan.version, Tag.DATA: plan.data,
            Tag.PARENT_DATA: ",".join(plan.frozen.data.paths), Tag.CHAMPION: said,
            Tag.START: "warm" if decision.role == "retrained" else "scratch"}  # fmt: skip
    for k, v in tags.items():
        client.set_model_version_tag(plan.name, version, k, v)
    if decision.promote and not moved:
        move_champion(client, plan.name, version)
        return version, promoted(version, now)
    return version, moved


def promoted(version: str, before: str) -> str:
    """The line of a promotion: the version ``@champion`` names now, and the one it named
    ``before`` ("none" without the alias; the same version: a re-run's)."""
    if before == version:
        return f"@{CHAMPION} names version {version} (as before)"
    was = "none before" if before == "none" else f"was version {before}"
    return f"@{CHAMPION} moved to version {version} ({was})"

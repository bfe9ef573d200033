"""MLflow bookkeeping of a sweep: one experiment per sweep name, a parent run for the sweep, one
child run per trial, re-attached by tag on resume (never duplicated).

Metrics are logged at their real training step, idempotently: a run remembers the last step it
logged (metric ``step``), and anything at or below it is skipped, so a restarted trial that
replays a report adds nothing twice. Logging failures (a tracking server that went away) never
fail a trial: the batch is kept and retried with the next report, and a warning says so.

A fresh SQLite store is created by whichever process opens it first, and MLflow's store does that
without a lock: two processes opening a new ``mlflow.db`` at once (the sweep and ``mlflow ui``, two
sweeps, a sweep's trials) race in its schema migration ("duplicate column name: step").
``open_store`` opens SQLite stores under a file lock beside the database (our processes take
turns, whatever spelling of the path they use) and retries with backoff when the race happens
anyway against a process that takes no lock, saying so.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

from filelock import FileLock
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from recsys.configlib import flatten

log = logging.getLogger(__name__)
T = TypeVar("T")


class Tag:
    """Every MLflow tag name this project writes or searches by, in one place."""

    SWEEP = "recsys.sweep"  # the sweep a run belongs to
    TRIAL = "recsys.trial_id"  # a trial run: the Tune trial id
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
    CHAMPION = "recsys.champion"  # a registered model version: "yes", or "no: <why>"
    VERDICT = "recsys.verdict"  # on the parent, + ".<arch>": beats / ties / does not beat, lead
    REFIT_OF = "recsys.refit_of"  # a refit's run (kind "refit"): the trial it trains again
    REFIT_ROWS = "recsys.refit_rows"  # ... and the rows it trained on
    RESUME_NOTE = "recsys.resume_note"  # what a resume on another worker count could not keep
    EDGE = "recsys.edge"  # on the parent, + ".<key>": the best trials pressed against its range
    EARLY_PEAKS = "recsys.early_peaks"  # on the parent: most trials peaked in their first tenth
    BEST_CHECKPOINT = "checkpoint.best"
    LAST_CHECKPOINT = "checkpoint.last"
    PARENT = "mlflow.parentRunId"  # MLflow's own: nests trial runs under the sweep's run
    NOTE = "mlflow.note.content"  # MLflow's own: a run's description (on the sweep's run)
    EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow 3's, on an experiment: what it is for
    VIEW = "mlflow.sharedViewState."  # the MLflow UI's, on an experiment: a saved view, + its key


NOT_LOGGED = {"loss_history", "checkpoint_path", "ckpt_score", "step"}
# a run's constants (its tables' sizes, per-rank bytes): logged when they change, not every report
CONSTANT_PREFIXES = ("emb_",)


OLD_SCHEMA = "out-of-date database schema"
RACES = ("duplicate column", "already exists", "database is locked", OLD_SCHEMA)
STALE_SCHEMA_S = 2.0  # the same old schema revision this long: an old store, not a migration


def raise_if_old_schema(uri: str, error: Exception) -> None:
    """An SQL store (SQLite, PostgreSQL...) made by an older MLflow is named with the user's
    step (a backup, then its upgrade); nothing here migrates a store."""
    if OLD_SCHEMA in str(error):
        raise old_schema_error(uri, error) from None


def old_schema_error(uri: str, error: Exception) -> ConnectionError:
    import mlflow

    found = re.search(r"found version (\w+), but expected (\w+)", str(error))
    revisions = f" (schema revision {found[1]}, this MLflow expects {found[2]})" if found else ""
    return ConnectionError(
        f"MLflow store {uri} was made by an older MLflow than this one ({mlflow.__version__})"
        f"{revisions}: back it up, then run `mlflow db upgrade {uri}`; recsys-sweep does not "
        "migrate a store itself"
    )


def open_store(uri: str, attempts: int = 8) -> None:
    """Create (or check) the store behind a ``sqlite:`` URI before anything writes to it. A
    store whose schema is older than this MLflow's (and stays so: not a migration in flight in
    another process) is an error naming ``mlflow db upgrade``."""
    if not uri.startswith("sqlite:"):
        return
    path = os.path.abspath(uri.split(":///", 1)[1])
    seen: dict[str, float] = {}  # an error's message -> when first seen
    with FileLock(path + ".init-lock"):
        for attempt in range(attempts):
            try:
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
                return
            except Exception as e:
                since = seen.setdefault(str(e), time.monotonic())  # (names an old revision)
                stale = OLD_SCHEMA in str(e) and time.monotonic() - since >= STALE_SCHEMA_S
                if stale or attempt == attempts - 1 or not any(r in str(e) for r in RACES):
                    raise_if_old_schema(uri, e)
                    raise
                first = str(e).strip().splitlines()[0][:200]
                log.warning(
                    "MLflow store %s: creating it raced another process (%s); retrying", path, first
                )
                time.sleep(0.25 * 2**attempt)


WAIT_ENV = "RECSYS_TRACKING_WAIT_S"  # how long a trial waits for an unreachable store (600 s)
UNREACHABLE = ("Max retries exceeded", "Connection refused", "Connection aborted", "timed out",
               "failed with exception", "error code 502", "error code 503", "error code 504",
               "could not connect", "server closed the connection")  # fmt: skip


def unreachable(error: Exception) -> bool:
    """An error of a store that is down or restarting (not of the request itself)."""
    return isinstance(error, (ConnectionError, TimeoutError)) or any(
        word in str(error) for word in UNREACHABLE
    )


def _short(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else repr(error)


def flat_params(data: dict[str, Any]) -> dict[str, str]:
    """Nested config -> ``{"model.interaction": "dot", ...}`` as MLflow params (strings)."""
    return {k: str(v)[:6000] for k, v in flatten(data).items()}


MODEL_TRAINING = "custom_model_development"  # MLflow 3's experiment kind for model training
VIEW_KEY = "recsys"  # the sweep's view of its runs, saved in its experiment (Tag.VIEW + key)
UI = "http://127.0.0.1:5000"  # where `mlflow ui`, as the sweep prints it, serves a local store


def ui_address(uri: str) -> str:
    """The MLflow UI that shows the store ``uri``: a tracking server's own address, else the
    ``mlflow ui`` the sweep's last line starts (``UI``)."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI


def runs_link(
    address: str, experiment_id: str, charts: bool = False, saved_view: bool = True
) -> str:
    """The MLflow UI's runs of an experiment as the sweep's saved view shows them (its filter,
    order, columns and charts; ``saved_view=False``: as the UI shows them by default), on the
    UI's model-training side (MLflow 3.17's UI picks that side by its sidebar switch, or by
    ``workflowType``, not by the experiment's kind); ``charts``: the charts, not the table."""
    link = f"{address}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    link += f"&viewStateShareKey={VIEW_KEY}" if saved_view else ""
    return link + ("&compareRunsMode=CHART" if charts else "")


def compare_line(uri: str, link: str) -> str:
    """The sweep's last line: the link to its runs, after the ``mlflow ui`` command that serves a
    local store."""
    if uri.startswith(("http://", "https://")):
        return f"compare the runs: {link}"
    port = urlparse(UI).port
    return (
        f"compare the runs: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {port}, "
        f"then open {link}"
    )


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def searched_axes(searched: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """From the trials' searched values: every searched parameter; those a parallel-coordinates
    chart can show (all numbers, or none: the MLflow UI drops the runs of the minority kind of a
    parameter that mixes them, ``None`` among numbers); and the numeric ones with at least two
    values (a scatter's axis), most values first."""
    params = list(dict.fromkeys(k for s in searched for k in s))
    values = {p: [s.get(p) for s in searched if p in s] for p in params}
    parallel = [p for p in params if len({_number(v) for v in values[p]}) == 1]
    distinct = {p: len({v for v in values[p] if _number(v)}) for p in parallel}
    numeric = [p for p in parallel if all(map(_number, values[p])) and distinct[p] >= 2]
    return params, parallel, sorted(numeric, key=lambda p: -distinct[p])


def sweep_view(
    sweep: str,
    scores: list[str],
    ascending: bool,
    params: list[str],
    axes: tuple[list[str], list[str]],
    also: list[str] | None = None,
) -> dict[str, Any]:
    """The MLflow UI's view state of a sweep's runs: its trials and baselines (not the sweep's
    own run, not the seed-check runs: their trial's row has their mean), best first by the first
    of ``scores`` (``ascending``: lower is better); the scores, the metrics ``also``, the
    searched ``params`` and the status as columns; charts of the first score against the
    searched parameters: parallel coordinates over ``axes[0]`` (with the scores), a scatter
    against each of the first two of ``axes[1]`` (numeric ones)."""
    first, (parallel, numeric) = scores[0], axes
    sections = [
        {"uuid": "recsys-parallel", "name": f"sweep {sweep}: {first} against the searched "
         "parameters", "display": True, "isReordered": False, "deleted": False,
         "isGenerated": False, "columns": 1, "cardHeight": 480},
        {"uuid": "recsys-scatter", "name": f"sweep {sweep}: {first} against a numeric parameter",
         "display": True, "isReordered": False, "deleted": False, "isGenerated": False,
         "columns": 2, "cardHeight": 360},
    ][: 2 if numeric else 1]  # fmt: skip
    charts: list[dict[str, Any]] = [
        {"uuid": "recsys-parallel-chart", "type": "PARALLEL", "metricSectionId": "recsys-parallel",
         "displayName": f"{first} against the searched parameters", "deleted": False,
         "isGenerated": False, "runsCountToCompare": 500, "selectedParams": parallel,
         "selectedMetrics": scores, "showAllRuns": True},
    ] + [
        {"uuid": f"recsys-scatter-{i}", "type": "SCATTER", "metricSectionId": "recsys-scatter",
         "displayName": f"{first} against {param}", "deleted": False, "isGenerated": False,
         "runsCountToCompare": 500, "xaxis": {"key": param, "type": "PARAM"},
         "yaxis": {"key": first, "type": "METRIC"}}
        for i, param in enumerate(numeric[:2])
    ]  # fmt: skip
    columns = [f"metrics.`{k}`" for k in scores + (also or [])]
    columns += [f"params.`{p}`" for p in params]
    kind = f"tags.`{Tag.KIND}`"
    return {
        # not the seed checks' runs, nor a refit (scored on rows it trained on)
        "searchFilter": f"{kind} != 'sweep:{sweep}' and {kind} != 'confirm' and {kind} != 'refit'",
        "orderByKey": f"metrics.`{first}`",
        "orderByAsc": ascending,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": [*columns, f"tags.`{Tag.STATUS}`"],
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        "compareRunSections": sections,
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
    }


def sweep_note(sweep: str, runs: list[Any], parent: Any, score: str) -> str:
    """The description of a sweep's run, one line: its trials (by status), baselines and seed
    runs, what scores them, the trial that won (``Tag.BEST_TRIAL``: by confirmed mean when the
    seed check ran) with its score and searched values, and its lead over each baseline."""
    tags = parent.data.tags
    metric, mode = tags.get(Tag.METRIC, "val_auc"), tags.get(Tag.MODE, "max")
    kinds: dict[str, list[Any]] = {}
    for r in runs:
        kinds.setdefault(r.data.tags.get(Tag.KIND, ""), []).append(r)
    trials, seeds = kinds.get("trial", []), kinds.get("confirm", [])
    statuses = Counter(r.data.tags.get(Tag.STATUS, "unfinished") for r in trials)
    line = f"Sweep {sweep}: {len(trials)} trial{'' if len(trials) == 1 else 's'}"
    line += f" ({', '.join(f'{n} {s}' for s, n in statuses.most_common())})" if trials else ""
    refs = Counter(r.data.params.get("model.arch", "?") for r in kinds.get("baseline", []))
    if refs:  # each reference arch once, with its trials where it had several
        named = [a if n == 1 else f"{a} (best of {n})" for a, n in sorted(refs.items())]
        line += f", baseline{'' if len(refs) == 1 else 's'} {', '.join(named)}"
    line += f", {len(seeds)} seed-check runs" if seeds else ""
    line += f"; scored by {score} ({mode})."
    best = tags.get(Tag.BEST_TRIAL)
    won = next((r for r in trials if best and r.data.tags.get(Tag.TRIAL) == best), None)
    if won is None:
        return line + " No trial won: none finished."
    line += f" Won: trial {best}"
    if (value := won.data.metrics.get(score)) is not None:
        line += f", {score} {value:.4f}"
    if (mean := won.data.metrics.get(f"confirmed_mean_{metric}")) is not None:
        n = sum(r.data.tags.get(Tag.CONFIRMS) == best for r in seeds)
        line += f" (confirmed mean {mean:.4f} over {n} seeds)"
    if searched := json.loads(won.data.tags.get(Tag.SEARCHED, "{}")):
        line += ", with " + " ".join(f"{k}={_value(v)}" for k, v in searched.items())
    prefix = "lead_over_"
    leads = sorted(
        (k[len(prefix) :], v) for k, v in parent.data.metrics.items() if k.startswith(prefix)
    )
    if leads:
        verdict = parent.data.tags.get
        ties = {a for a, _ in leads if verdict(f"{Tag.VERDICT}.{a}", "").startswith("ties")}
        line += "; lead over " + ", ".join(
            f"{arch} {lead:+.4f}" + (" (a tie: inside the seed noise)" if arch in ties else "")
            for arch, lead in leads
        )
    return line + "."


MIN_ARTIFACT_FREE = 256 * 2**20  # a local artifact root with less free space is refused at launch
LOG_LATER = "mlflow artifacts log-artifacts --run-id {run} --local-dir {path}"


def local_path(uri: str) -> str | None:
    """The folder behind a local artifact location (``file:`` URI or path), else None."""
    if uri.startswith("file:"):
        return url2pathname(urlparse(uri).path)
    return uri if "://" not in uri and ":" not in uri.split("/")[0] else None


class Tracker:
    """A thin layer over ``MlflowClient`` for sweeps.

    ``keep``: a folder where artifacts MLflow could not store (a full artifact disk, a server that
    went away) are written instead, ``<keep>/<run id>/<name>``, with a warning that names it and
    the command that logs them later; nothing is dropped."""

    def __init__(self, uri: str, keep: str | None = None) -> None:
        # a tracking outage must not stall training for minutes in MLflow's default backoff
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        # a tracking server's client prints two "View run" lines per ended run: 400 at 200 trials
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri = uri
        open_store(uri)
        try:
            self.client = MlflowClient(tracking_uri=uri)  # (an SQL store is checked here)
        except Exception as e:
            raise_if_old_schema(uri, e)  # an SQL store URI (postgresql://...) of an older MLflow
            raise
        self.keep = keep
        self._pending: dict[str, list[Metric]] = {}
        self._last_step: dict[str, int] = {}
        self._constants: dict[str, dict[str, float]] = {}  # run -> constants as last logged

    def check_reachable(self) -> None:
        """Fail fast, naming the URI, when the store cannot be reached."""
        saved = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        try:
            self.client.search_experiments(max_results=1)
        except Exception as e:
            raise_if_old_schema(self.uri, e)
            if any(
                word in str(e) for word in ("401", "403", "UNAUTHENTICATED", "PERMISSION_DENIED")
            ):
                raise ConnectionError(
                    f"MLflow tracking store {self.uri} refused the credentials (set "
                    f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
                    f"MLFLOW_TRACKING_TOKEN): {str(e)[:300]}"
                ) from None
            raise ConnectionError(f"MLflow tracking store {self.uri} is unreachable: {e}") from None
        finally:
            if saved is None:
                del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
            else:
                os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = saved

    def check_artifact_space(self, name: str) -> None:
        """Refuse, before launch, a local artifact root (a SQLite store's ``mlartifacts``, a
        ``file:`` location) with less than ``MIN_ARTIFACT_FREE`` free. A server's own artifact
        store is not visible from here: a full one costs a warning, the artifact is kept."""
        exp = self.client.get_experiment_by_name(name)
        root = exp.artifact_location if exp is not None else self._default_root(name)
        path = local_path(root) if root else None
        if path is None:
            return
        probe = os.path.abspath(path)
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        free = shutil.disk_usage(probe).free
        if free < MIN_ARTIFACT_FREE:
            raise ConnectionError(
                f"MLflow artifact root {path} has {free / 2**20:.0f} MiB free (a sweep needs at "
                f"least {MIN_ARTIFACT_FREE / 2**20:.0f} MiB for its configs, plots and best "
                "checkpoints): free space there, or give the experiment another artifact location"
            )

    def _default_root(self, name: str) -> str | None:
        if self.uri.startswith(("sqlite:", "file:")):
            db = os.path.abspath(self.uri.split(":///", 1)[1])
            return Path(os.path.dirname(db), "mlartifacts", name).as_uri()
        return None

    def archive_experiment(self, name: str) -> str:
        """The experiment ``name`` renamed ``<name> (archived <time>)`` with its runs, so that a
        new sweep of that name starts a new one; returns the new name ('' if there was none)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            return ""
        to = f"{name} (archived {time.strftime('%Y-%m-%d %H:%M:%S')})"
        self.client.rename_experiment(exp.experiment_id, to)
        return to

    def experiment(self, name: str, artifact_root: str | None = None) -> str:
        """The experiment ``name`` (created if new), marked as a model-training experiment
        (``Tag.EXPERIMENT_KIND``; an existing one without a kind is marked too, one a user gave
        another kind is left as it is). A local store's artifacts default to
        ``mlartifacts/<name>`` beside its database, not to ``./mlruns`` in the working folder."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if Tag.EXPERIMENT_KIND not in exp.tags:
                self._mark_model_training(str(exp.experiment_id))
            return str(exp.experiment_id)
        artifact_root = artifact_root or self._default_root(name)
        return str(
            self.client.create_experiment(
                name, artifact_location=artifact_root, tags={Tag.EXPERIMENT_KIND: MODEL_TRAINING}
            )
        )

    def _mark_model_training(self, experiment_id: str) -> None:
        try:
            self.client.set_experiment_tag(experiment_id, Tag.EXPERIMENT_KIND, MODEL_TRAINING)
        except Exception as e:
            log.warning("MLflow %s: could not mark experiment %s as model training (%s)",
                        self.uri, experiment_id, _short(e))  # fmt: skip

    def _waiting(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, waited out while the store is unreachable (a server restarting), up to
        ``RECSYS_TRACKING_WAIT_S`` seconds, with one warning: what a trial cannot go on without
        (its run) waits instead of failing the trial."""
        deadline = time.monotonic() + float(os.environ.get(WAIT_ENV, "600"))
        delay, warned = 1.0, False
        while True:
            try:
                return call()
            except Exception as e:
                if not unreachable(e) or time.monotonic() + delay > deadline:
                    raise
                if not warned:
                    wait = os.environ.get(WAIT_ENV, "600")
                    log.warning("MLflow %s unreachable (%s): %s waits for it (up to %s s)",
                                self.uri, _short(e), what, wait)  # fmt: skip
                    warned = True
                time.sleep(delay)
                delay = min(2 * delay, 10.0)

    def _find(self, experiment_id: str, tag: str, value: str) -> Any:
        runs = self._waiting(
            f"finding the run with {tag}={value}",
            lambda: self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{tag}` = '{value}'", max_results=5
            ),
        )
        return runs[0] if runs else None

    def find_trial_run(self, experiment_id: str, trial_id: str) -> Any:
        """The MLflow run of Tune trial ``trial_id`` (None if it has none)."""
        return self._find(experiment_id, Tag.TRIAL, trial_id)

    def parent_run(self, experiment_id: str, sweep: str) -> str:
        return self._waiting(f"sweep {sweep}", lambda: self._parent(experiment_id, sweep))

    def _parent(self, experiment_id: str, sweep: str) -> str:
        found = self._find(experiment_id, Tag.KIND, f"sweep:{sweep}")
        if found is not None:
            self.client.update_run(found.info.run_id, status="RUNNING")
            return str(found.info.run_id)
        run = self.client.create_run(
            experiment_id, run_name=sweep, tags={Tag.SWEEP: sweep, Tag.KIND: f"sweep:{sweep}"}
        )
        return str(run.info.run_id)

    def trial_run(
        self,
        experiment_id: str,
        parent_id: str,
        sweep: str,
        trial_id: str,
        params: dict[str, str],
        kind: str = "trial",
        name: str = "",
        tags: dict[str, str] | None = None,
    ) -> str:
        """The trial's run: the existing one (a restored trial, or one left RUNNING by a killed
        driver) or a new child of ``parent_id`` (the sweep's run; a seed check's: the run of the
        trial it confirms) with every resolved config value as a param. ``kind``: the trial's
        role (``Tag.KIND``); ``name``: the run's name (default: the trial id). Waits out an
        unreachable store (a retried creation finds the run it made)."""
        return self._waiting(
            f"trial {trial_id}",
            lambda: self._open_trial_run(
                experiment_id, trial_id, params, name or trial_id,
                {**(tags or {}), Tag.PARENT: parent_id, Tag.TRIAL: trial_id, Tag.SWEEP: sweep,
                 Tag.KIND: kind},
            ),
        )  # fmt: skip

    def _open_trial_run(
        self, experiment_id: str, trial_id: str, params: dict[str, str], name: str, tags: dict
    ) -> str:
        found = self._find(experiment_id, Tag.TRIAL, trial_id)
        if found is not None:
            self.client.update_run(found.info.run_id, status="RUNNING")
            if len(found.data.params) < len(params):  # made, then the store went away
                self._log_params(found.info.run_id, params)
            self._attach(found.info.run_id, found.data.metrics)
            return str(found.info.run_id)
        run = self.client.create_run(experiment_id, run_name=name, tags=tags)
        run_id = str(run.info.run_id)
        self._log_params(run_id, params)
        self._attach(run_id, {})
        return run_id

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def last_step(self, run_id: str) -> int:
        if run_id not in self._last_step:
            run = self._waiting(f"run {run_id}", lambda: self.client.get_run(run_id))
            self._attach(run_id, run.data.metrics)
        return self._last_step[run_id]

    def _attach(self, run_id: str, metrics: dict[str, float]) -> None:
        """Start from what an existing run has: its last step and its constants' values."""
        self._last_step[run_id] = int(metrics.get("step", 0))
        self._constants[run_id] = dict(metrics)

    def log_report(self, run_id: str, metrics: dict[str, Any]) -> None:
        """Log one report: the loss history at its steps, the rest at the report's step (a run's
        constants, ``CONSTANT_PREFIXES``, only when they differ from what the run has)."""
        step = int(metrics.get("step", 0))
        last = self.last_step(run_id)
        now = int(time.time() * 1000)
        batch = [
            Metric("loss", float(v), now, int(s))
            for s, v in metrics.get("loss_history", [])
            if int(s) > last
        ]
        if step > last:
            known = self._constants[run_id]  # (last_step attached the run)
            for k, v in metrics.items():
                if k in NOT_LOGGED or not isinstance(v, (int, float)) or v != v:
                    continue
                if k.startswith(CONSTANT_PREFIXES):
                    if known.get(k) == float(v):
                        continue
                    known[k] = float(v)
                batch.append(Metric(k, float(v), now, step))
            batch.append(Metric("step", float(step), now, step))
        self._pending.setdefault(run_id, []).extend(batch)
        self._flush(run_id)
        if step > last:
            self._last_step[run_id] = step

    def log_values(self, run_id: str, values: dict[str, float]) -> None:
        """Log values at the run's last step (timings, summaries)."""
        now = int(time.time() * 1000)
        step = self.last_step(run_id)
        batch = [Metric(k, float(v), now, step) for k, v in values.items()]
        self._pending.setdefault(run_id, []).extend(batch)
        self._flush(run_id)

    def _flush(self, run_id: str) -> None:
        pending = self._pending.get(run_id, [])
        try:
            for i in range(0, len(pending), 500):
                self.client.log_batch(run_id, metrics=pending[i : i + 500])
            self._pending[run_id] = []
        except Exception as e:
            log.warning(
                "MLflow %s unreachable (%s); %d metrics kept for retry, training goes on",
                self.uri,
                e,
                len(pending),
            )

    def log_text(self, run_id: str, text: str, name: str) -> None:
        try:
            self.client.log_text(run_id, text, name)
        except Exception as e:
            self._keep(run_id, name, e, lambda dst: Path(dst).write_text(text))

    def log_file(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        """Log one file as an artifact (under ``artifact_path``)."""
        try:
            self.client.log_artifact(run_id, path, artifact_path)
        except Exception as e:
            name = os.path.join(artifact_path or "", os.path.basename(path))
            self._keep(run_id, name, e, lambda dst: shutil.copyfile(path, dst))

    def log_folder(self, run_id: str, folder: str, artifact_path: str) -> None:
        """Log a folder (a checkpoint, which stays where it is if MLflow cannot take it)."""
        try:
            self.client.log_artifacts(run_id, folder, artifact_path=artifact_path)
        except Exception as e:
            log.warning(
                "MLflow %s could not store %s of run %s (%s); it stays at %s: log it later with "
                "`%s --artifact-path %s`", self.uri, artifact_path, run_id, _short(e), folder,
                LOG_LATER.format(run=run_id, path=folder), artifact_path,
            )  # fmt: skip

    def _keep(self, run_id: str, name: str, error: Exception, write: Any) -> None:
        """An artifact MLflow refused: written to ``keep`` and named, never dropped silently."""
        if self.keep is None:
            log.warning("MLflow %s: could not log %s (%s)", self.uri, name, _short(error))
            return
        folder = os.path.join(self.keep, run_id)
        dst = os.path.join(folder, name)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            write(dst)
        except OSError as e:
            log.warning("MLflow %s: could not log %s (%s), nor keep it at %s (%s)", self.uri,
                        name, _short(error), dst, e)  # fmt: skip
            return
        log.warning(
            "MLflow %s could not store %s of run %s (%s); kept at %s: log it later with `%s`",
            self.uri, name, run_id, _short(error), dst, LOG_LATER.format(run=run_id, path=folder),
        )  # fmt: skip

    def has_experiment(self, name: str) -> bool:
        return self.client.get_experiment_by_name(name) is not None

    def runs(self, experiment: str, filter_string: str, order_by: list[str] | None = None) -> list:
        """Runs of the experiment named ``experiment`` matching ``filter_string``; [] if none."""
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return list(self.client.search_runs([exp.experiment_id], filter_string, order_by=order_by))

    def show_sweep(self, sweep: str, scores: list[str] | None = None) -> str:
        """Make the sweep's runs readable in the MLflow UI, and return the link to them: its
        experiment marked as model training, the description of its run (``Tag.NOTE``: what the
        sweep was and which trial won), and a saved view of its runs (``sweep_view``, under
        ``VIEW_KEY``, which the link opens). ``scores``: the keys of its objectives' scores
        (default: ``best_<metric>`` of its run's metric). Read from MLflow alone, so it can be
        run again on any sweep's store; a store that refuses costs a warning, never the sweep."""
        exp = self.client.get_experiment_by_name(sweep)
        if exp is None:
            raise ValueError(f"no sweep named {sweep!r} in {self.uri}")
        experiment_id = self.experiment(sweep)
        link = runs_link(ui_address(self.uri), experiment_id)
        try:
            runs = self.runs(sweep, "")
            parent = next((r for r in runs if r.data.tags.get(Tag.KIND) == f"sweep:{sweep}"), None)
            tags = parent.data.tags if parent is not None else {}
            metric, mode = tags.get(Tag.METRIC, "val_auc"), tags.get(Tag.MODE, "max")
            trials = [r for r in runs if r.data.tags.get(Tag.KIND) == "trial"]
            scores = scores or [f"best_{metric}"]
            searched = [json.loads(r.data.tags.get(Tag.SEARCHED, "{}")) for r in trials]
            params, parallel, numeric = searched_axes(searched)
            checked = any(f"confirmed_mean_{metric}" in r.data.metrics for r in trials)
            also = [f"confirmed_mean_{metric}"] if checked else []
            view = sweep_view(sweep, scores, mode != "max", params, (parallel, numeric), also)
            now = int(time.time() * 1000)
            saved = {"name": f"{sweep}: its runs by {scores[0]}", "createdAt": now,
                     "updatedAt": now, "state": json.dumps(view)}  # fmt: skip
            self.client.set_experiment_tag(experiment_id, Tag.VIEW + VIEW_KEY, json.dumps(saved))
            if parent is not None:
                note = sweep_note(sweep, runs, parent, scores[0])
                self.client.set_tag(parent.info.run_id, Tag.NOTE, note)
        except Exception as e:
            link = runs_link(ui_address(self.uri), experiment_id, saved_view=False)
            log.warning("MLflow %s: could not save the view of sweep %s (%s); its runs are at "
                        "%s all the same", self.uri, sweep, _short(e), link)  # fmt: skip
        return link

    def download(self, run_id: str, artifact: str, dst: str) -> str:
        return str(self.client.download_artifacts(run_id, artifact, dst))

    def log_model(self, run_id: str, registered_name: str | None, **pyfunc: Any) -> str:
        """Log an MLflow pyfunc model in run ``run_id`` (and register it); returns its URI.
        Raises on failure: a model export is asked for explicitly, never skipped silently."""
        import mlflow.pyfunc

        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name="served_model", registered_model_name=registered_name, **pyfunc
            )
        return str(info.model_uri)

    def log_dataset(
        self, run_id: str, fields: Callable[[], dict[str, str]], context: str = "training"
    ) -> None:
        """The data a run saw as an MLflow dataset input (``fields()``: ``recsys.tracking.inputs.
        describe``'s; the UI's Datasets column); a failure, describing the data included, is a
        warning, as for every log here."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        try:
            dataset = Dataset(**{k: v or None for k, v in fields().items()})  # type: ignore[arg-type]
            tags = [InputTag("mlflow.data.context", context)]
            self.client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags)])
        except Exception as e:
            log.warning("MLflow %s: could not log the dataset input (%s)", self.uri, e)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        try:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception as e:
            log.warning("MLflow %s: could not set tags (%s)", self.uri, e)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self._flush(run_id)
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception as e:
            log.warning("MLflow %s: could not end run %s (%s)", self.uri, run_id, e)

"""MLflow bookkeeping of a sweep: one experiment per sweep name, a parent run for the sweep, one
child run per trial, re-attached by tag on resume (never duplicated).

Metrics are logged at their real training step, idempotently: a run remembers the last step it
logged (metric ``step``), and anything at or below it is skipped, so a restarted trial that
replays a report adds nothing twice. Logging failures (a tracking server that went away) never
fail a trial: the batch is kept and retried with the next report, and a warning says so.

The tag names are ``recsys.tracking.tags``; opening the store and waiting it out,
``recsys.tracking.store``; what a sweep leaves for the MLflow UI, ``recsys.tracking.view``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from recsys.config import ExperimentConfig
from recsys.configlib import flatten
from recsys.tracking.store import (
    check_reachable,
    open_store,
    raise_if_old_schema,
    short,
    unreachable,
    waited,
)
from recsys.tracking.tags import Tag
from recsys.tracking.view import runs_link, save_view, ui_address

log = logging.getLogger(__name__)
T = TypeVar("T")


NOT_LOGGED = {"loss_history", "checkpoint_path", "ckpt_score", "step"}
# a run's constants (its tables' sizes, per-rank bytes): logged when they change, not every report
CONSTANT_PREFIXES = ("emb_",)


def flat_params(data: dict[str, Any]) -> dict[str, str]:
    """Nested config -> ``{"model.interaction": "dot", ...}`` as MLflow params (strings)."""
    return {k: str(v)[:6000] for k, v in flatten(data).items()}


MODEL_TRAINING = "custom_model_development"  # MLflow 3's experiment kind for model training


MIN_ARTIFACT_FREE = 256 * 2**20  # a local artifact root with less free space is refused at launch
LOG_LATER = "mlflow artifacts log-artifacts --run-id {run} --local-dir {path}"


def local_path(uri: str) -> str | None:
    """The folder behind a local artifact location (``file:`` URI or path), else None."""
    if uri.startswith("file:"):
        return url2pathname(urlparse(uri).path)
    return uri if "://" not in uri and ":" not in uri.split("/")[0] else None


DATASETS = threading.Lock()  # one dataset input logged at a time in this process


class Tracker:
    """A thin layer over ``MlflowClient`` for sweeps.

    ``keep``: a folder where artifacts MLflow could not store (a full artifact disk, a server that
    went away) are written instead, ``<keep>/<run id>/<name>``, with a warning that names it and
    the command that logs them later; nothing is dropped.

    ``strict``: for a caller that retries itself (``recsys.tracking.writer``): what MLflow did
    not take (metrics, tags, a run's end; an artifact, where the store was unreachable) raises
    MLflow's error rather than a warning (metrics stay kept for the next try), and nothing waits
    for an unreachable store."""

    def __init__(self, uri: str, keep: str | None = None, strict: bool = False) -> None:
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
        self.keep, self.strict = keep, strict
        self._pending: dict[str, list[Metric]] = {}
        self._last_step: dict[str, int] = {}
        self._constants: dict[str, dict[str, float]] = {}  # run -> constants as last logged

    def check_reachable(self) -> None:
        """Fail fast, naming the URI, when the store cannot be reached."""
        check_reachable(self.client, self.uri)

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
                        self.uri, experiment_id, short(e))  # fmt: skip

    def _waiting(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, waited out while the store is unreachable (``recsys.tracking.store.waited``):
        what a trial cannot go on without (its run) waits instead of failing the trial (not
        ``strict``)."""
        return call() if self.strict else waited(self.uri, what, call)

    def _find(self, experiment_id: str, tag: str, value: str) -> Any:
        runs = self._waiting(
            f"finding the run with {tag}={value}",
            lambda: self.client.search_runs(
                [experiment_id], filter_string=f"tags.`{tag}` = '{value}'", max_results=5
            ),
        )
        return runs[0] if runs else None

    def trial_runs(self, experiment_id: str) -> dict[str, Any]:
        """Every trial run of the experiment, by trial id (one search, page by page)."""
        runs: dict[str, Any] = {}
        token: str | None = None

        def search() -> Any:
            return self.client.search_runs([experiment_id], max_results=1000, page_token=token)

        while True:
            page = self._waiting(f"the trial runs of experiment {experiment_id}", search)
            for run in page:
                if Tag.TRIAL in run.data.tags:
                    runs[run.data.tags[Tag.TRIAL]] = run
            token = page.token
            if not token:
                return runs

    def find_trial_run(self, experiment_id: str, trial_id: str) -> Any:
        """The MLflow run of trial ``trial_id`` (Tune's id, or a halved reference point's; None if
        it has none)."""
        return self._find(experiment_id, Tag.TRIAL, trial_id)

    def parent_run(self, experiment_id: str, sweep: str, kind: str = "sweep") -> str:
        """The parent run of sweep ``sweep`` (``kind``: what it is, its ``Tag.KIND`` reads
        ``<kind>:<sweep>``; a retrain's is ``retrain``), found again or created, running."""
        return self._waiting(f"{kind} {sweep}", lambda: self._parent(experiment_id, sweep, kind))

    def _parent(self, experiment_id: str, sweep: str, kind: str) -> str:
        found = self._find(experiment_id, Tag.KIND, f"{kind}:{sweep}")
        if found is not None:
            self.client.update_run(found.info.run_id, status="RUNNING")
            return str(found.info.run_id)
        run = self.client.create_run(
            experiment_id, run_name=sweep, tags={Tag.SWEEP: sweep, Tag.KIND: f"{kind}:{sweep}"}
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
            if Tag.STATUS in found.data.tags:  # trained again (a halved point's next round)
                self.client.delete_tag(found.info.run_id, Tag.STATUS)
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
        if step > last:  # (before the flush: a report tried again adds nothing twice)
            self._last_step[run_id] = step
        self.flush(run_id)

    def log_values(self, run_id: str, values: dict[str, float]) -> None:
        """Log values at the run's last step (timings, summaries)."""
        now = int(time.time() * 1000)
        step = self.last_step(run_id)
        batch = [Metric(k, float(v), now, step) for k, v in values.items()]
        self._pending.setdefault(run_id, []).extend(batch)
        self.flush(run_id)

    def flush(self, run_id: str) -> None:
        """Log ``run_id``'s metrics not logged yet (kept while MLflow failed: a warning says so,
        or, ``strict``, MLflow's error)."""
        pending = self._pending.setdefault(run_id, [])
        try:
            while pending:  # (a batch MLflow took is not sent again)
                self.client.log_batch(run_id, metrics=pending[:500])
                del pending[:500]
        except Exception as e:
            if self.strict:
                raise
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
            self._raise_if_retried(e)
            self._keep(run_id, name, e, lambda dst: Path(dst).write_text(text))

    def log_file(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        """Log one file as an artifact (under ``artifact_path``)."""
        try:
            self.client.log_artifact(run_id, path, artifact_path)
        except Exception as e:
            self._raise_if_retried(e)
            name = os.path.join(artifact_path or "", os.path.basename(path))
            self._keep(run_id, name, e, lambda dst: shutil.copyfile(path, dst))

    def log_folder(self, run_id: str, folder: str, artifact_path: str) -> None:
        """Log a folder (a checkpoint, which stays where it is if MLflow cannot take it)."""
        try:
            self.client.log_artifacts(run_id, folder, artifact_path=artifact_path)
        except Exception as e:
            self._raise_if_retried(e)
            log.warning(
                "MLflow %s could not store %s of run %s (%s); it stays at %s: log it later with "
                "`%s --artifact-path %s`", self.uri, artifact_path, run_id, short(e), folder,
                LOG_LATER.format(run=run_id, path=folder), artifact_path,
            )  # fmt: skip

    def _raise_if_retried(self, error: Exception) -> None:
        """``strict``: an artifact the store was down for is the caller's to try again."""
        if self.strict and unreachable(error):
            raise error

    def _keep(self, run_id: str, name: str, error: Exception, write: Any) -> None:
        """An artifact MLflow refused: written to ``keep`` and named, never dropped silently."""
        if self.keep is None:
            log.warning("MLflow %s: could not log %s (%s)", self.uri, name, short(error))
            return
        folder = os.path.join(self.keep, run_id)
        dst = os.path.join(folder, name)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            write(dst)
        except OSError as e:
            log.warning("MLflow %s: could not log %s (%s), nor keep it at %s (%s)", self.uri,
                        name, short(error), dst, e)  # fmt: skip
            return
        log.warning(
            "MLflow %s could not store %s of run %s (%s); kept at %s: log it later with `%s`",
            self.uri, name, run_id, short(error), dst, LOG_LATER.format(run=run_id, path=folder),
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
        ``VIEW_KEY``, which the link opens: ``recsys.tracking.view``). ``scores``: the keys of its
        objectives' scores (default: ``best_<metric>`` of its run's metric). Read from MLflow
        alone, so it can be run again on any sweep's store; a store that refuses costs a warning,
        never the sweep."""
        exp = self.client.get_experiment_by_name(sweep)
        if exp is None:
            raise ValueError(f"no sweep named {sweep!r} in {self.uri}")
        experiment_id = self.experiment(sweep)
        try:
            save_view(self.client, sweep, experiment_id, scores)
        except Exception as e:
            link = runs_link(ui_address(self.uri), experiment_id, saved_view=False)
            log.warning("MLflow %s: could not save the view of sweep %s (%s); its runs are at "
                        "%s all the same", self.uri, sweep, short(e), link)  # fmt: skip
            return link
        return runs_link(ui_address(self.uri), experiment_id)

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
            with DATASETS:  # (MLflow looks the dataset up, then inserts it: two threads both would)
                self.client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags)])
        except Exception as e:
            log.warning("MLflow %s: could not log the dataset input (%s)", self.uri, e)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        try:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception as e:
            if self.strict:
                raise
            log.warning("MLflow %s: could not set tags (%s)", self.uri, e)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.flush(run_id)
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception as e:
            if self.strict:
                raise
            log.warning("MLflow %s: could not end run %s (%s)", self.uri, run_id, e)

    def discard(self, run_id: str) -> int:
        """Forget ``run_id``'s metrics MLflow would not take (a run it no longer has); how many."""
        return len(self._pending.pop(run_id, []))


def run_config(tracker: Tracker, run_id: str) -> ExperimentConfig:
    """The config a trial's run trained with (its ``config.yaml`` artifact)."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        open(tracker.download(run_id, "config.yaml", tmp)) as f,
    ):
        return ExperimentConfig.from_dict(yaml.safe_load(f))

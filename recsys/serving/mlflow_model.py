"""An export as an MLflow model: recorded in a trial's run (the export's checks as metrics, its
``meta.json``, the pyfunc model that scores raw rows with its input example and signature:
``export_to_run``), registered with its sweep's verdict (the alias ``@champion`` on the
confirmed winner: ``crown``), and a registered version traced back to its trial and exported again
(``export_registered``). Which trial a sweep publishes is ``recsys.tune.publish``'s.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from recsys.config import ExperimentConfig
from recsys.data.schema import DatasetSchema
from recsys.serving.export import ExportReport, export
from recsys.serving.scorer import (
    META_FILE,
    MODEL_FILE,
    PREPARED_DIR,
    TabularScorer,
    pip_requirements,
)
from recsys.tracking.tags import Tag
from recsys.tracking.tracker import Tracker, run_config
from recsys.tracking.uris import parse_model_uri

# What the libraries print while an export runs that says nothing to its user (the console test:
# tests/distributed/test_export.py): DCP's note on loading without a process group (the export
# loads in one process on purpose), two TorchScript notes on annotations in TorchRec's and
# torch's own modules, and MLflow's hint on integer columns (the served model's id columns are
# integers: a missing id is null in a list column or a float column, which the signature takes).
EXPORT_WARNINGS = (
    "torch.distributed is disabled, unavailable or uninitialized",
    "The TorchScript type system doesn't support instance-level annotations",
    "TorchScript will treat type annotations of Tensor dtype-specific subtypes",
    "Hint: Inferred schema contains integer column",
)


def quiet_libraries() -> None:
    """Keep an export's console to its result (as the sweep's): the warnings above, torch.fx's
    note on ``is_fx_tracing`` (logged by TorchRec's tracing), MLflow's INFO lines and its
    download progress bars (``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``, unless set)."""
    import logging
    import warnings

    for message in EXPORT_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{re.escape(message)}")
    logging.getLogger("torch.fx._symbolic_trace").addFilter(
        lambda record: "is_fx_tracing will return true" not in record.getMessage()
    )
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def export_to_run(
    tracker: Tracker,
    run_id: str,
    ckpt: str,
    cfg: ExperimentConfig,
    out_dir: str,
    dtype: str,
    register: str | None,
) -> tuple[ExportReport, str]:
    """Export a trial's checkpoint into ``out_dir`` and record it in the trial's run ``run_id``:
    the export's checks as metrics, its ``meta.json``, the MLflow model scoring raw rows
    (registered under ``register`` if given). The report and the model's URI."""
    report = export(cfg, ckpt, out_dir, dtype)
    tracker.log_values(run_id, report.as_metrics())
    tracker.log_file(run_id, os.path.join(out_dir, META_FILE), "export")
    example = serving_example(os.path.join(out_dir, PREPARED_DIR))
    return report, log_served_model(tracker, run_id, out_dir, example, register)


def log_served_model(
    tracker: Tracker,
    run_id: str,
    export_dir: str,
    example: Any,
    registered_name: str | None = None,
) -> str:
    """Log an export as an MLflow pyfunc model in run ``run_id`` (and register it); its URI."""
    from mlflow.models import infer_signature

    artifacts = {
        "model": os.path.join(export_dir, MODEL_FILE),
        "meta": os.path.join(export_dir, META_FILE),
        "prepared": os.path.join(export_dir, PREPARED_DIR),
    }
    scorer = TabularScorer()
    scorer.load_context(type("Ctx", (), {"artifacts": artifacts})())
    recsys_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tracker.log_model(
        run_id,
        registered_name,
        python_model=os.path.join(recsys_dir, "serving", "served_model.py"),  # a model from code
        artifacts=artifacts,
        code_paths=[recsys_dir],
        input_example=example,
        signature=infer_signature(
            signature_rows(example, os.path.join(export_dir, PREPARED_DIR)),
            scorer.predict(None, example),
        ),
        pip_requirements=pip_requirements(),
    )


def serving_example(prepared_dir: str) -> Any:
    """The served model's input example: a few raw rows of the data set, dense columns as
    float64 (the signature then accepts missing values, which integers cannot hold in pandas),
    weight lists and sequence times as lists of Python floats (float64: the signature then takes
    float32 and float64 lists alike)."""
    import pandas as pd

    schema = prepared_schema(prepared_dir)
    example = plain_columns(pd.read_parquet(os.path.join(prepared_dir, "examples.parquet")))
    for c in float_lists(schema):
        example[c] = [None if v is None else [float(x) for x in v] for v in example[c]]
    return example.astype({c: "float64" for c in schema.dense})


def prepared_schema(prepared_dir: str) -> DatasetSchema:
    with open(os.path.join(prepared_dir, META_FILE)) as f:
        return DatasetSchema.from_dict(json.load(f)["schema"])


def float_lists(schema: DatasetSchema) -> list[str]:
    """The list columns the served example holds as Python floats: weights and sequence times."""
    roles = schema.roles()
    return roles["weights"] + roles["orders"]


def signature_rows(example: Any, prepared_dir: str) -> Any:
    """``example`` (``serving_example``'s, of the folder ``prepared_dir``) as the signature is
    inferred from: MLflow takes a list column's element type from its non-empty lists, and where
    every example row's list is empty (a log's first rows, whose histories have not begun) it
    gives up on the whole input (``Any``: no column named or checked). Such a column gets one
    element in its first row: a float for weights and sequence times (``float_lists``), else
    one of its Parquet element type; the logged input example stays as the rows were."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    floats = set(float_lists(prepared_schema(prepared_dir)))
    out = example.copy()
    for field in pq.read_schema(os.path.join(prepared_dir, "examples.parquet")):
        kind = field.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or field.name not in out:
            continue
        if any(v is not None and len(v) for v in out[field.name]):
            continue
        value = kind.value_type
        if field.name in floats or pa.types.is_floating(value):
            one: Any = [0.0]
        elif pa.types.is_integer(value):
            one = np.zeros(1, dtype=np.int64)
        else:
            one = np.array([""], dtype=object)
        out[field.name] = [one, *list(out[field.name])[1:]]
    return out


def plain_columns(frame: Any) -> Any:
    """``frame`` with categorical columns (dictionary-encoded Parquet read by pandas) as plain
    values: MLflow's signature check refuses categories (its input example must not have them;
    a caller scoring such a frame converts it the same way, ``df.astype({col: str})``)."""
    cats = [c for c in frame.columns if str(frame[c].dtype) == "category"]
    return frame.astype({c: object for c in cats}) if cats else frame


CHAMPION = "champion"  # the registered model's alias for a sweep's confirmed winner


def champion_verdict(tracker: Tracker, sweep: str, run_id: str) -> tuple[bool, dict[str, str]]:
    """Whether the trial of run ``run_id`` is its sweep's confirmed winner: the best confirmed
    mean of a seed check, separable from the runner-up, and beating every reference (none
    tied: ``recsys.verdict.<arch>``); and the tags that say so on its model version (the
    verdicts, and ``recsys.champion``: ``yes`` or ``no: <why>``)."""
    parents = tracker.runs(sweep, f"tags.`{Tag.KIND}` = 'sweep:{sweep}'")
    tags = parents[0].data.tags if parents else {}
    run_tags = tracker.client.get_run(run_id).data.tags  # a refit speaks for its trial
    trial = run_tags.get(Tag.REFIT_OF) or run_tags.get(Tag.TRIAL, "")
    order = json.loads(tags.get(Tag.CONFIRMED_ORDER, "[]"))
    verdicts = {k: v for k, v in tags.items() if k.startswith(f"{Tag.VERDICT}.")}
    won = tags.get(Tag.WINNER_KIND) == "reference" and trial == tags.get(Tag.WINNER_TRIAL)
    if trial and won:
        return reference_verdict(sweep, trial, tags, bool(order))
    why = []
    if not order:
        why.append("no seed check confirmed it")
    elif order[0] != trial:
        why.append(f"trial {order[0]} has the best confirmed mean")
    elif len(order) >= 2 and tags.get(Tag.SEPARABLE) != "yes":
        why.append(f"its lead over {order[1]} is inside the seed noise")
    why += [f"it {v.split(':')[0]} {k.rsplit('.', 1)[1]}" for k, v in sorted(verdicts.items())
            if not v.startswith("beats")]  # fmt: skip
    said = "yes" if not why else "no: " + "; ".join(why)
    return not why, {Tag.SWEEP: sweep, Tag.TRIAL: trial, **verdicts, Tag.CHAMPION: said}


def reference_verdict(
    sweep: str, trial: str, tags: dict[str, str], checked: bool
) -> tuple[bool, dict[str, str]]:
    """A reference that is its sweep's best model (``recsys.winner``): the champion where the
    search's best was seed-checked and still trails it (outside the noise), not on single
    reports."""
    said = "yes" if checked else "no: no seed check: the search's best trails it by single reports"
    winner = {Tag.WINNER: tags.get(Tag.WINNER, "")}
    return checked, {Tag.SWEEP: sweep, Tag.TRIAL: trial, **winner, Tag.CHAMPION: said}


def crown(tracker: Tracker, name: str, sweep: str, run_id: str) -> tuple[str, str]:
    """The model version that ``register`` made of run ``run_id``, tagged with the sweep's
    verdict, and given the alias ``@champion`` when ``champion_verdict`` says it won; returns
    its URI (``models:/NAME@champion`` or ``models:/NAME/VERSION``) and the verdict's line."""
    client = tracker.client
    version = newest_version(tracker, name, run_id)
    wins, tags = champion_verdict(tracker, sweep, run_id)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if not wins:
        return f"models:/{name}/{version}", f"not @{CHAMPION}: {tags[Tag.CHAMPION][4:]}"
    move_champion(client, name, version)
    kind = "a reference no trial beats" if Tag.WINNER in tags else "the confirmed winner"
    return f"models:/{name}@{CHAMPION}", f"@{CHAMPION}: version {version}, {kind}"


def move_champion(client: Any, name: str, version: str) -> None:
    """``@champion`` of registered model ``name`` moved to ``version``; the version it leaves
    re-tagged ``recsys.champion: "was: @champion moved to version N"`` (its ``yes`` said it
    held the alias: one version of a name says ``yes``, the one the alias names)."""
    try:
        before = str(client.get_model_version_by_alias(name, CHAMPION).version)
    except Exception:  # MlflowException: the name has no @champion yet
        before = ""
    client.set_registered_model_alias(name, CHAMPION, version)
    if before and before != str(version):
        said = f"was: @{CHAMPION} moved to version {version}"
        client.set_model_version_tag(name, before, Tag.CHAMPION, said)


def newest_version(tracker: Tracker, name: str, run_id: str) -> str:
    """The newest version of registered model ``name`` made from run ``run_id``."""
    versions = tracker.client.search_model_versions(f"name = '{name}'")
    return max((v for v in versions if v.run_id == run_id), key=lambda v: int(v.version)).version


def registered_version(tracker: Tracker, model_uri: str) -> Any:
    """The MLflow model version ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` names; a
    malformed URI, or an unknown name, alias or version, named."""
    name, alias, number = parse_model_uri(model_uri)
    try:
        if alias:
            return tracker.client.get_model_version_by_alias(name, alias)
        return tracker.client.get_model_version(name, number)
    except Exception as e:  # MlflowException: RESOURCE_DOES_NOT_EXIST, its message says which
        there = what_is_registered(tracker, name, by_alias=bool(alias))
        raise ValueError(f"--model {model_uri!r}: not in {tracker.uri}: {e}{there}") from None


SHOWN = 10  # the versions or models an error lists at most (the newest)


def what_is_registered(tracker: Tracker, name: str, by_alias: bool = True) -> str:
    """For an error on ``name``: its newest versions and its aliases where it has some (asked
    ``by_alias``: a version gets ``@champion`` only from a win, so name one by number), else
    the registered models."""
    try:
        versions = sorted(tracker.client.search_model_versions(f"name = '{name}'"),
                          key=lambda v: int(v.version))  # fmt: skip
        if not versions:
            names = sorted(m.name for m in tracker.client.search_registered_models())
            return f" (registered there: {shown(names) or 'none'})"
        aliases = {a: v.version for v in versions for a in (v.aliases or [])}
        held = ", ".join(f"@{a} (version {v})" for a, v in sorted(aliases.items())) or "none"
        hint = (f"; a version gets @{CHAMPION} only where it won: name one by number, "
                f"models:/{name}/{versions[-1].version}" if by_alias else "")  # fmt: skip
        numbers = shown([str(v.version) for v in versions])
        return f" ({name} has versions {numbers}; aliases: {held}{hint})"
    except Exception:  # (the store itself failed: its error above says so)
        return ""


def shown(items: list[str]) -> str:
    """``items`` joined, the last ``SHOWN`` of them where there are more."""
    cut = f"... ({len(items) - SHOWN} more), " if len(items) > SHOWN else ""
    return cut + ", ".join(items[-SHOWN:])


def registered_trial(tracker: Tracker, model_uri: str) -> tuple[str, str, Any]:
    """The trial behind a registered model, ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``
    (a version logged by ``recsys-export`` or ``--export``): its run id, best checkpoint and
    config. An unknown name, alias or version, or a version whose run is no trial, is named."""
    version = registered_version(tracker, model_uri)
    if not version.run_id:
        raise ValueError(f"--model {model_uri!r}: its version has no run (not logged by a trial)")
    run_id = str(version.run_id)
    ckpt = tracker.client.get_run(run_id).data.tags.get(Tag.BEST_CHECKPOINT)
    if not ckpt:
        raise ValueError(
            f"--model {model_uri!r}: its run {run_id} has no {Tag.BEST_CHECKPOINT} tag "
            "(not a trial's run: recsys-export --checkpoint exports a checkpoint folder)"
        )
    return run_id, ckpt, run_config(tracker, run_id)


def export_registered(
    tracking_uri: str,
    model_uri: str,
    out_dir: str,
    dtype: str = "int8",
    register: str | None = None,
) -> tuple[str, ExportReport, str]:
    """Export the trial behind ``model_uri`` again (``registered_trial``: another dtype, or a
    fresh copy for a server), from its best checkpoint; recorded in its run as ``export_best``
    records one (``export_to_run``), registered under ``register`` if given. Its run id, report
    and MLflow model URI."""
    tracker = Tracker(tracking_uri)
    run_id, ckpt, cfg = registered_trial(tracker, model_uri)
    report, uri = export_to_run(tracker, run_id, ckpt, cfg, out_dir, dtype, register)
    if register:
        uri = carry_verdict(tracker, model_uri, register, run_id)
    return run_id, report, uri


def carry_verdict(tracker: Tracker, source: str, name: str, run_id: str) -> str:
    """The version that ``register`` just made of run ``run_id``, re-exported from the registered
    model ``source``: given ``source``'s verdict tags (its sweep, trial, verdicts and whether it
    is a champion: the same trial's), not its alias (an alias names one version of one name);
    its URI ``models:/NAME/VERSION``."""
    client = tracker.client
    source_version = registered_version(tracker, source)
    version = newest_version(tracker, name, run_id)
    for key, value in (source_version.tags or {}).items():
        if key == Tag.CHAMPION:  # the alias stays on the source: this version is no champion
            value = f"no: a re-export of {source} (the alias stays there)"
        if key.startswith("recsys."):
            client.set_model_version_tag(name, version, key, value)
    return f"models:/{name}/{version}"

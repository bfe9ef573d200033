"""Does a sweep find a model as good as a careful hand-written one, and how close is it to the best
possible? On two logs prepared by the product's own preparation:

- ``planted``: categorical fields only, a few thousand users and items, planted pairwise
  interactions, whose true click probability is known (``recsys.demo.planted``): the oracle
  (Bayes-optimal) AUC of the test rows is computable;
- ``demo``: the demo click log (``recsys-synth``: two tasks, multi-hot lists, numeric columns),
  swept by the shipped ``clicklogs`` space.

Each is swept through ``recsys-sweep`` (its own local Ray and SQLite store, with the space's
references; ``--search optuna`` for TPE instead of random trials), the best trial exported (INT8)
and **served**: the MLflow model's ``TabularScorer`` scores the raw test rows. Against it, on the
same prepared split: an independent plain-PyTorch MLP (``benchmarks.independent``: embeddings
concatenated, batch norm, dropout, Adam, early stopping), the sweep's references (each its best
checkpoint on the prepared test rows) against scikit-learn's ``LogisticRegression`` (``C`` tuned on
validation) and a plain-PyTorch FM, and the oracle. Every model's peak (where its validation score
was best) and whether it overfits (its validation score fell after the peak before it stopped) are
reported.

Goals (``benchmarks.goals``): the sweep's best at least the plain MLP's test AUC and at least 90%
of the way from 0.5 to the oracle's; the LR reference within 0.005 of scikit-learn's on either
side, the FM reference not more than 0.005 below the plain FM (as
``tests/distributed/test_reference_quality.py`` holds them).

A part ``drift`` (``benchmarks.drift``) sweeps a real-shaped log split by time whose tastes
drift, refits the best and holds it against scikit-learn's LR refitted alike; its goals: the LR
reference within 0.003 validation AUC of scikit-learn's tuned LR, the refitted best at least the
refitted LR on the test rows.

A part ``two-tasks`` (``benchmarks.experts``) trains one DLRM with a shared bottom, MMoE and PLE
(and for one task each) on the planted log's two-task variant over 8 seeds: goal, MMoE or PLE
beats the shared bottom on each task. A fourth, ``sequences`` (``benchmarks.sequences``),
trains one DLRM with each sequence pooling (sum, target attention, transformer) on a planted log
whose click depends on the user's recent history, over 3 seeds: goal, attention beats sum by at
least 0.01 test AUC.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from typing import Any

import numpy as np
import yaml

from benchmarks import independent as ind
from benchmarks.common import table
from benchmarks.goals import (
    SHARE,
    TOLERANCE,
    at_least,
    beats_plain_mlp,
    fm_reference,
    lr_reference,
    oracle_share,
    shown,
)
from benchmarks.logs import ROOT, Log, Row, own_space, served, sweep


def short_value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# --- the two logs ------------------------------------------------------------------------------


def planted_log(tmp: str, rows: int) -> Log:
    from recsys.data.schema import DatasetSchema
    from recsys.demo import planted
    from recsys.prepare.pipeline import prepare

    raw = os.path.join(tmp, "planted_raw")
    path = planted.write(raw, rows)
    out = os.path.join(tmp, "planted")
    schema = DatasetSchema.from_dict(planted.schema_dict())
    meta = prepare(schema, [raw], out, workers=0, log=lambda s: None)
    test = planted.test_rows(path, meta)
    space = own_space(os.path.join(tmp, "planted_space.yaml"), one_task=True)
    log = Log("planted", out, test, ["click"], space, "val_auc", planted.oracle_auc(test))
    log.structure = structure_lr(path, meta["split"]["row_bounds"])
    return log


def structure_lr(path: str, bounds: list[int]) -> Row:
    """What a learner told the planted structure reaches from the same training rows:
    scikit-learn's ``LogisticRegression`` on one-hot ids plus the planted pairs as explicit
    crosses (``segment x category``, ``device x category``, ``hour x country``, ``user x
    category``), ``C`` tuned on the validation rows. Not a model a sweep can find (it is given
    the answer): the finite-data ceiling the oracle's share is read against."""
    import pandas as pd
    import pyarrow.parquet as pq
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    from recsys.metrics.binary import auc

    t0 = time.perf_counter()
    frame = pq.read_table(path).to_pandas()
    cols = ["user", "item", "category", "segment", "country", "hour", "device"]
    pairs = [("segment", "category"), ("device", "category"), ("hour", "country"),
             ("user", "category")]  # fmt: skip
    keys = [frame[c].astype(str) for c in cols] + [
        frame[a].astype(str) + "|" + frame[b].astype(str) for a, b in pairs
    ]
    codes, base = [], 0
    for k in keys:
        c, uniques = pd.factorize(k)
        codes.append(c + base)
        base += len(uniques)
    idx = np.stack(codes, 1)
    n, width = idx.shape
    x = sparse.csr_matrix(
        (np.ones(idx.size), idx.ravel(), np.arange(0, idx.size + 1, width)), shape=(n, base)
    )
    y = frame["click"].to_numpy()
    train, val, test = slice(0, bounds[0]), slice(bounds[0], bounds[1]), slice(bounds[1], n)
    best = (-1.0, math.nan, 0.0)
    for c in (0.03, 0.1, 0.3, 1.0):
        model = LogisticRegression(C=c, max_iter=3000).fit(x[train], y[train])
        v = auc(y[val], model.decision_function(x[val]))
        if v > best[0]:
            best = (v, auc(y[test], model.decision_function(x[test])), c)
    return Row("LR told the planted crosses (a ceiling)", best[0], best[1],
               setting=f"C={best[2]}; crosses {', '.join(' x '.join(p) for p in pairs)}",
               seconds=time.perf_counter() - t0)  # fmt: skip


def demo_log(tmp: str, rows: int) -> Log:
    import pandas as pd
    import pyarrow.parquet as pq

    from recsys.data.schema import DatasetSchema
    from recsys.demo import clicklogs
    from recsys.prepare.pipeline import prepare
    from recsys.prepare.values import epoch_seconds

    raw = os.path.join(tmp, "demo_raw")
    files = clicklogs.write(raw, rows, files=2)
    out = os.path.join(tmp, "demo")
    schema = DatasetSchema.load(os.path.join(ROOT, "schemas", "clicklogs.yaml"))
    meta = prepare(schema, [raw], out, workers=0, log=lambda s: None)
    cut = meta["split"]["time_cuts"][1]
    frames = []
    for f in files:
        t = pq.read_table(f)
        keep = epoch_seconds(t.column(schema.time))[0] >= cut
        frames.append(t.filter(keep).to_pandas())
    test = pd.concat(frames, ignore_index=True)
    if len(test) != meta["rows"]["test"]:
        raise RuntimeError(f"demo: {len(test)} raw test rows, the preparation {meta['rows']}")
    space = own_space(os.path.join(tmp, "demo_space.yaml"), one_task=False)
    return Log("demo", out, test, list(schema.labels), space, "val_auc/mean")


# --- the sweep ---------------------------------------------------------------------------------


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def peak_of(client: Any, run: Any, metric: str, train_rows: int) -> tuple[str, str, str]:
    """Where a trial's validation score peaked and where it stopped (in epochs and steps), and
    whether it overfits (its score at the end more than 0.002 below the peak)."""
    vals = history(client, run.info.run_id, metric)
    if not vals:
        return "-", "-", "-"
    epochs = dict(history(client, run.info.run_id, "epochs_done"))
    best = max(vals, key=lambda sv: sv[1])
    last = vals[-1]

    def at(step: int) -> str:
        e = epochs.get(step)
        return f"epoch {e:.1f} (step {step})" if e is not None else f"step {step}"

    drop = best[1] - last[1]
    return at(best[0]), at(last[0]), f"yes (-{drop:.4f})" if drop > 0.002 else "no"


def checkpoint_test(cfg: Any, checkpoint: str, data: dict[str, ind.Rows]) -> list[float]:
    """A trial's best checkpoint (FP32, unsharded) on the prepared test rows: AUC per task."""
    import torch

    from recsys.data.input.loader import load_splits, to_batch
    from recsys.serving.export import load_fp32, raw_layout

    model = load_fp32(cfg, checkpoint)
    test = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).test
    out = []
    with torch.no_grad():
        for s in range(0, len(test), 8192):
            b = to_batch(test.read(s, min(s + 8192, len(test))), raw_layout(cfg))
            out.append(model(b.dense_features, b.sparse_features).float())
    return ind.aucs(data["test"].labels, torch.cat(out).numpy())


def sweep_rows(log: Log, run: dict[str, Any], data: dict[str, ind.Rows], train_rows: int
               ) -> tuple[Row, dict[str, Row], str]:  # fmt: skip
    """The served best trial's row, each reference's row (its best checkpoint on the test rows),
    and a line about the search."""
    from mlflow.tracking import MlflowClient

    from recsys.config import ExperimentConfig

    client = MlflowClient(run["uri"])
    exp = client.get_experiment_by_name(log.name)
    assert exp is not None, f"no MLflow experiment {log.name!r} in {run['uri']}"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = next(r for r in runs if r.data.tags.get("recsys.kind") == f"sweep:{log.name}")
    best_id = parent.data.tags["recsys.best_trial"]
    by_trial = {r.data.tags.get("recsys.trial_id"): r for r in runs}
    best = by_trial[best_id]
    key = f"best_{log.metric}"
    peak, stopped, over = peak_of(client, best, log.metric, train_rows)
    searched = json.loads(best.data.tags.get("recsys.searched", "{}"))
    setting = ", ".join(f"{k.rsplit('.', 1)[-1]}={short_value(v)}" for k, v in searched.items())
    tasks = served(log, run["export"])
    value = best.data.metrics.get(key, math.nan)
    top = Row("sweep's best (served)", value, float(np.mean(tasks)), peak, stopped, over, setting,
              run["seconds"], tasks)  # fmt: skip
    refs = {}
    for r in runs:
        reference = r.data.tags.get("recsys.reference", "")
        if r.data.tags.get("recsys.kind") != "baseline" or not reference.startswith("best of"):
            continue
        arch = r.data.params["model.arch"]
        with tempfile.TemporaryDirectory() as t:
            path = client.download_artifacts(r.info.run_id, "config.yaml", t)
            with open(path) as f:
                cfg = ExperimentConfig.from_dict(yaml.safe_load(f))
        test = checkpoint_test(cfg, r.data.tags["checkpoint.best"], data)
        p, s, o = peak_of(client, r, log.metric, train_rows)
        refs[arch] = Row(f"{arch} reference ({reference.split(':')[0]})", r.data.metrics.get(
            key, math.nan), float(np.mean(test)), p, s, o, reference.split(": ", 1)[-1],
            per_task=test)  # fmt: skip
    trials = [r for r in runs if r.data.tags.get("recsys.kind") == "trial"]
    status: dict[str, int] = {}
    for r in trials:
        st = r.data.tags.get("recsys.status", "?")
        status[st] = status.get(st, 0) + 1
    n_refs = sum(1 for r in runs if r.data.tags.get("recsys.kind") == "baseline")
    line = (f"{len(trials)} search trials ({', '.join(f'{n} {s}' for s, n in status.items())}; "
            f"{by_arch(trials, key)}), {len(refs)} references from {n_refs} reference trials; the "
            f"sweep took {run['seconds']:.0f} s")  # fmt: skip
    return top, refs, line


def by_arch(trials: list[Any], key: str) -> str:
    """How many search trials each architecture had and its best ``key`` among them."""
    scores: dict[str, list[float]] = {}
    for r in trials:
        arch = r.data.params.get("model.arch", "?")
        scores.setdefault(arch, []).append(r.data.metrics.get(key, math.nan))
    out = []
    for arch, v in sorted(scores.items()):
        top = max((x for x in v if math.isfinite(x)), default=math.nan)
        out.append(f"{arch} {len(v)}, its best {top:.4f}")
    return ", ".join(out)


# --- the independent models -------------------------------------------------------------------


def fitted_row(f: ind.Fitted) -> Row:
    peak = f"epoch {f.peak:.1f}" if math.isfinite(f.peak) else "-"
    stopped = f"epoch {f.epochs:.1f}" if math.isfinite(f.epochs) else "-"
    over = ("yes" if f.overfits else "no") if f.curve else "-"
    return Row(f.name, f.mean("val"), f.mean("test"), peak, stopped, over, f.chosen, f.seconds,
               f.test_auc)  # fmt: skip


def independent(log: Log, epochs: int = 40) -> tuple[dict[str, ind.Rows], dict[str, ind.Fitted],
                                                      Any]:  # fmt: skip
    from recsys.config import ExperimentConfig
    from recsys.data.dataset import resolve

    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared",
                                                       "paths": [log.prepared]}}))  # fmt: skip
    data = ind.arrays(cfg, [t.label_column for t in cfg.loss.tasks])
    rows, pools = cfg.embeddings.num_embeddings, ind.poolings(cfg)
    fm = [ind.plain_fm(data, cfg, 16, lr=lr, max_epochs=epochs, patience=3) for lr in (1e-3, 3e-3)]
    mlp = [
        ind.plain_mlp(data, cfg, 16, (256, 128), dropout, lr=1e-3, max_epochs=epochs, patience=3)
        for dropout in (0.1, 0.3)
    ]
    fits = {"lr": ind.sklearn_lr(data, rows, pools), "fm": best_of(fm), "mlp": best_of(mlp)}
    return data, fits, cfg


def best_of(fits: list[ind.Fitted]) -> ind.Fitted:
    """The best by validation; its setting says what was tried."""
    best = max(fits, key=lambda f: f.mean("val"))
    best.chosen = f"{best.chosen} (best of {len(fits)} by validation)"
    best.seconds = sum(f.seconds for f in fits)
    return best


# --- the benchmark -----------------------------------------------------------------------------


def run_log(log: Log, tmp: str, samples: int, workers: int, concurrent: int, smoke: bool,
            search: str) -> str:  # fmt: skip
    t0 = time.perf_counter()
    data, fits, _ = independent(log, 1 if smoke else 40)
    t_ind = time.perf_counter() - t0
    print(f"{log.name}: independent models in {t_ind:.0f} s", flush=True)
    run = sweep(log, tmp, samples, workers, concurrent, smoke, search)
    print(f"{log.name}: sweep in {run['seconds']:.0f} s", flush=True)
    top, refs, line = sweep_rows(log, run, data, len(data["train"]))
    rows = [top, fitted_row(fits["mlp"]), refs.get("fm"), fitted_row(fits["fm"]), refs.get("lr"),
            fitted_row(fits["lr"])]  # fmt: skip
    if log.structure is not None:
        rows.append(log.structure)
    if math.isfinite(log.oracle):
        rows.append(Row("oracle (true p_click)", math.nan, log.oracle, setting="Bayes-optimal"))
    tasks = len(log.labels) > 1
    header = ["model", f"best {log.metric}", "test AUC" + (" (mean of tasks)" if tasks else ""),
              *([f"test AUC {' / '.join(log.labels)}"] if tasks else []), "peak (best val)",
              "stopped at", "overfits", "setting", "seconds"]  # fmt: skip
    body = table(header, [r.cells(tasks) for r in rows if r is not None])
    goals = goal_rows(log, top, fits, refs)
    n = {k: len(v) for k, v in data.items()}
    head = (f"**{log.name}**: {n['train']:,} training, {n['val']:,} validation, {n['test']:,} test "
            f"rows ({', '.join(log.labels)}); {line}.\n\n")  # fmt: skip
    verdicts = table(["goal", "figure", "verdict"], goals)
    return head + body + "\n\n" + verdicts


def goal_rows(log: Log, top: Row, fits: dict[str, ind.Fitted], refs: dict[str, Row]
              ) -> list[list[str]]:  # fmt: skip
    """The goals' rows: each verdict from ``benchmarks.goals``, each difference printed with the
    digits its verdict needs."""
    out = []
    mlp = fits["mlp"].mean("test")
    gain = shown(top.test - mlp, lambda d: beats_plain_mlp(mlp + d, mlp))
    out.append(["sweep's best >= plain MLP (test AUC)", f"{top.test:.4f} vs {mlp:.4f} ({gain})",
                beats_plain_mlp(top.test, mlp)])  # fmt: skip
    if math.isfinite(log.oracle):
        share = (top.test - 0.5) / (log.oracle - 0.5)
        need = 0.5 + SHARE * (log.oracle - 0.5)
        ceiling = ""
        if log.structure is not None:
            got = (log.structure.test - 0.5) / (log.oracle - 0.5)
            ceiling = f"; an LR told the planted crosses: {got:.1%}"
        share_text = shown(share, lambda x: at_least(x, SHARE), 1, sign=False, percent=True)
        out.append([f"sweep's best >= {SHARE:.0%} of the way from 0.5 to the oracle",
                    f"{share_text} ({top.test:.4f}; the oracle {log.oracle:.4f}, {SHARE:.0%} is "
                    f"{need:.4f}{ceiling})", oracle_share(top.test, log.oracle)])  # fmt: skip
    for arch, what, judge in (
        ("lr", f"within {TOLERANCE} of scikit-learn LR, either side", lr_reference),
        ("fm", f"not more than {TOLERANCE} below plain FM", fm_reference),
    ):
        ref, other = refs.get(arch), fits[arch].mean("test")
        if ref is None:
            out.append([f"{arch} reference {what}", "no reference", "-"])
            continue
        diff = ref.test - other
        figure = f"{ref.test:.4f} vs {other:.4f} ({shown(diff, judge)})"
        out.append([f"{arch} reference {what}", figure, judge(diff)])
    return out


def run(rows: int, demo_rows: int, samples: int, logs: list[str], workers: int,
        concurrent: int, smoke: bool = False, search: str = "random",
        drift_rows: int = 40_000) -> str:  # fmt: skip
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.perf_counter()
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in logs:
            if name == "two-tasks":  # experts against a shared bottom (benchmarks.experts)
                from benchmarks import experts

                seeds, epochs = ([0], 0.5) if smoke else (list(range(8, 16)), 8.0)
                parts.append(experts.run(rows, seeds, epochs))
                continue
            if name == "sequences":  # sequence poolings (benchmarks.sequences)
                from benchmarks import sequences

                seeds, epochs = ([0], 0.5) if smoke else ([0, 1, 2], 8.0)
                parts.append(sequences.run(rows, seeds, epochs))
                continue
            if name == "drift":  # a real-shaped time split (benchmarks.drift)
                from benchmarks import drift

                parts.append(drift.run(drift_rows, samples, workers, concurrent, smoke, search,
                                       tmp))  # fmt: skip
                continue
            log = planted_log(tmp, rows) if name == "planted" else demo_log(tmp, demo_rows)
            parts.append(run_log(log, tmp, samples, workers, concurrent, smoke, search))
    minutes = (time.perf_counter() - t0) / 60
    if not set(logs) & {"planted", "demo"}:  # no sweep of theirs: each part says what it did
        return "\n\n".join(parts)
    head = (f"{samples} {search} search trials per log (the shipped `clicklogs` space, its "
            f"references by the default rules), {workers} worker(s) per trial, {concurrent} at a "
            f"time; {minutes:.1f} min in all.\n\n")  # fmt: skip
    return head + "\n\n".join(parts)

"""The quality benchmark's ``drift`` part: winners you can trust on a real-shaped log.

A generated log shaped like a real one (``recsys.demo.drift``): users, items that appear and
fade, a category, the hour and weekday, the user's last clicked items as a sequence, split by
time, and tastes that move between the training period and the later validation and test rows.
It is swept as a user would (``recsys-sweep`` over the shipped own-data space with the sequence's
pooling as a choice, its LR and FM references, ``--export int8 --refit``), and held against
scikit-learn's ``LogisticRegression`` on the same one-hot features, ``C`` tuned over decades on
the same validation rows, then refitted on training + validation at that ``C``.

Goals (``benchmarks.goals``): the LR reference within 0.003 validation AUC of scikit-learn's
tuned LR (``lr_reference_val``); the sweep's best, refitted and served, at least the tuned LR
refitted on training + validation, on the test rows (``refit_beats_lr``). And what the sweep
says of itself on such a log: whether a reference's grid walked its edge, which ranges its best
trials pressed against, and whether most trials peaked within the first tenth of their budget.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import yaml

from benchmarks import independent as ind
from benchmarks.common import table
from benchmarks.goals import LR_VAL_TOLERANCE, lr_reference_val, refit_beats_lr, shown
from benchmarks.logs import ROOT, Log, served, sweep

CS = (1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)  # scikit-learn's C over decades


def drift_log(tmp: str, rows_per_period: int, seed: int = 0) -> Log:
    """Three periods of the drift log prepared with its schema (15% validation, 15% test by
    time: both after most training rows, in the third period), its raw test rows and oracle."""
    import pandas as pd
    import pyarrow.parquet as pq

    from recsys.data.schema import DatasetSchema
    from recsys.demo import drift
    from recsys.prepare.pipeline import prepare
    from recsys.prepare.values import epoch_seconds

    raw = os.path.join(tmp, "drift_raw")
    path = drift.write(raw, seed, drift.Shape(rows_per_period=rows_per_period), range(3))
    out = os.path.join(tmp, "drift")
    schema = DatasetSchema.from_dict(drift.schema_dict())
    meta = prepare(schema, [raw], out, workers=0, log=lambda s: None)
    t = pq.read_table(path)
    test = t.filter(epoch_seconds(t.column("ts"))[0] >= meta["split"]["time_cuts"][1])
    frame: Any = pd.DataFrame(test.to_pandas())
    if len(frame) != meta["rows"]["test"]:
        raise RuntimeError(f"drift: {len(frame)} raw test rows, the preparation {meta['rows']}")
    space = drift_space(os.path.join(tmp, "drift_space.yaml"))
    return Log("drift", out, frame, ["click"], space, "val_auc", drift.oracle_auc(frame))


def drift_space(path: str) -> str:
    """The shipped own-data space (``search_spaces/clicklogs.yaml``) for one task, scored by
    ``val_auc``, with the history's pooling a choice (as docs/own-data.md says to add it)."""
    with open(os.path.join(ROOT, "search_spaces", "clicklogs.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["space"] = {k: v for k, v in raw["space"].items() if not k.startswith("loss.task_")}
    raw["space"]["model.sequence.pooling"] = {"choice": ["sum", "attention", "transformer"]}
    raw["metric"] = "val_auc"
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def sklearn_refit(data: dict[str, ind.Rows], cfg: Any) -> tuple[float, float, float, float]:
    """scikit-learn's ``LogisticRegression`` on the one-hot features: ``C`` chosen by validation
    AUC over ``CS``, then refitted on training + validation at that ``C``. Its validation AUC,
    the ``C``, its test AUC trained on the training rows, and refitted."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    from recsys.metrics.binary import auc

    rows, pools = cfg.embeddings.num_embeddings, ind.poolings(cfg)
    x = {k: ind.design(v, rows, pools) for k, v in data.items()}
    y = {k: v.labels[:, 0] for k, v in data.items()}
    best = (-math.inf, math.nan, math.nan)
    for c in CS:
        m = LogisticRegression(C=c, max_iter=5000).fit(x["train"], y["train"])
        v = auc(y["val"], m.decision_function(x["val"]))
        if v > best[0]:
            best = (v, c, auc(y["test"], m.decision_function(x["test"])))
    both_x = sparse.vstack([x["train"], x["val"]], format="csr")
    both_y = np.concatenate([y["train"], y["val"]])
    refit = LogisticRegression(C=best[1], max_iter=5000).fit(both_x, both_y)
    return best[0], best[1], best[2], auc(y["test"], refit.decision_function(x["test"]))


def reference_val(client: Any, runs: list[Any], arch: str) -> tuple[float, str]:
    """The chosen reference of ``arch``: its best validation AUC and how it was chosen."""
    for r in runs:
        reference = r.data.tags.get("recsys.reference", "")
        if (
            r.data.tags.get("recsys.kind") == "baseline"
            and reference.startswith("best of")
            and (r.data.params.get("model.arch") == arch)
        ):
            return r.data.metrics.get("best_val_auc", math.nan), reference
    return math.nan, "no reference"


def said(console: str) -> dict[str, list[str]]:
    """What the sweep said of itself: its references' walks, its edges, its early peaks, its
    best model."""
    lines = console.splitlines()
    return {
        "walks": [ln for ln in lines if ln.startswith("reference ") and "extended" in ln],
        "edges": [ln for ln in lines if ln.startswith("edge: ")],
        "early": [ln for ln in lines if ln.startswith("early peaks: ")],
        "best model": [ln.strip() for ln in lines if ln.strip().startswith("the best model here")],
    }


def run(rows_per_period: int, samples: int, workers: int, concurrent: int, smoke: bool,
        search: str, tmp: str) -> str:  # fmt: skip
    """The part's markdown: the log, the models, the goals, what the sweep said."""
    from mlflow.tracking import MlflowClient

    from recsys.config import ExperimentConfig
    from recsys.data.dataset import resolve

    t0 = time.perf_counter()
    log = drift_log(tmp, rows_per_period)
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared",
                                                       "paths": [log.prepared]}}))  # fmt: skip
    data = ind.arrays(cfg, [0])
    sk_val, c, sk_test, sk_refit = sklearn_refit(data, cfg)
    print(f"drift: scikit-learn's LR in {time.perf_counter() - t0:.0f} s", flush=True)
    run = sweep(log, tmp, samples, workers, concurrent, smoke, search, refit=True)
    print(f"drift: sweep in {run['seconds']:.0f} s", flush=True)
    client = MlflowClient(run["uri"])
    exp = client.get_experiment_by_name(log.name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=2000)
    lr_val, how = reference_val(client, runs, "lr")
    fm_val, fm_how = reference_val(client, runs, "fm")
    ours = float(np.mean(served(log, run["export"])))
    parent = next(r for r in runs if r.data.tags.get("recsys.kind") == f"sweep:{log.name}")
    winner = parent.data.tags.get("recsys.winner", "-")
    n = {k: len(v) for k, v in data.items()}
    models = table(["model", "val AUC", "test AUC", "setting"], [
        ["sweep's best, refitted on training + validation (served)", "-", f"{ours:.4f}", winner],
        ["LR reference (the sweep's)", f"{lr_val:.4f}", "-", how],
        ["FM reference (the sweep's)", f"{fm_val:.4f}", "-", fm_how],
        ["scikit-learn LR, C tuned on validation", f"{sk_val:.4f}", f"{sk_test:.4f}", f"C={c:g}"],
        ["scikit-learn LR, refitted on training + validation", "-", f"{sk_refit:.4f}",
         f"C={c:g}"],
        ["oracle (true p_click)", "-", f"{log.oracle:.4f}", "Bayes-optimal"],
    ])  # fmt: skip
    gap, lead = lr_val - sk_val, ours - sk_refit
    lead_text = shown(lead, lambda d: refit_beats_lr(sk_refit + d, sk_refit))
    gap_text = shown(gap, lambda d: lr_reference_val(sk_val + d, sk_val))
    goals = table(["goal", "figure", "verdict"], [
        [f"LR reference within {LR_VAL_TOLERANCE} val AUC of scikit-learn's tuned LR",
         f"{lr_val:.4f} vs {sk_val:.4f} ({gap_text})", lr_reference_val(lr_val, sk_val)],
        ["sweep's best refitted and served >= scikit-learn's LR refitted (test AUC)",
         f"{ours:.4f} vs {sk_refit:.4f} ({lead_text})", refit_beats_lr(ours, sk_refit)],
    ])  # fmt: skip
    words = said(run["console"])
    said_rows = [[k, "<br>".join(v) if v else "(nothing)"] for k, v in words.items()]
    head = (f"**drift** (`recsys.demo.drift`, 3 periods of {rows_per_period:,} rows, split by "
            f"time): {n['train']:,} training, {n['val']:,} validation, {n['test']:,} test rows; "
            f"{samples} {search} search trials, {workers} worker(s) each, {concurrent} at a time; "
            f"the part took {(time.perf_counter() - t0) / 60:.1f} min.\n\n")  # fmt: skip
    return (head + models + "\n\n" + goals + "\n\nWhat the sweep said of itself:\n\n"
            + table(["what", "its lines"], said_rows))  # fmt: skip

"""What a sweep leaves for the MLflow UI: the UI's address and the links to a sweep's runs, the
saved view of its runs (filter, order, columns, charts of the score against the searched
parameters: ``sweep_view``), and its run's one-line description (``sweep_note``), both saved by
``save_view`` (``Tracker.show_sweep``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any
from urllib.parse import urlparse

from recsys.tracking.tags import Tag

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
    seed check ran) with its score and searched values, and its lead over each baseline; where a
    reference beat every trial (``Tag.WINNER_KIND``), that trial is the search's best and the
    reference is named as the best model."""
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
    reference = tags.get(Tag.WINNER_KIND) == "reference"  # a reference beat every trial
    line += f" Best of the search: trial {best}" if reference else f" Won: trial {best}"
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
    if reference:
        return line + f". The best model is {tags.get(Tag.WINNER)}: no search trial beats it."
    return line + "."


def save_view(client: Any, sweep: str, experiment_id: str, scores: list[str] | None) -> None:
    """Save the sweep's view of its runs in its experiment (``sweep_view``, under ``VIEW_KEY``)
    and its run's description (``Tag.NOTE``: ``sweep_note``), read from MLflow alone; ``scores``:
    the keys of its objectives' scores (default: ``best_<metric>`` of its run's metric)."""
    runs = list(client.search_runs([experiment_id], ""))
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
    client.set_experiment_tag(experiment_id, Tag.VIEW + VIEW_KEY, json.dumps(saved))
    if parent is not None:
        client.set_tag(parent.info.run_id, Tag.NOTE, sweep_note(sweep, runs, parent, scores[0]))

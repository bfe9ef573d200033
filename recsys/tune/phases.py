"""A sweep's phases besides the search: the references' verdicts, and the seed check of the best.

The references themselves are searched beside the search (``recsys.tune.baselines``); here their
best (``chosen_references``: the best of an arch's trials trained to their end) joins the
search's ranking, and each reference's verdict is drawn (``Outcome``). Each phase is a Tune
experiment of its own in the sweep's folder, restored like the search on ``--resume``; its trials
are ordinary trials (``run_trial``), recorded in MLflow with their role (``Tag.KIND``).

- **References**: the one the summary, the table and ``lead_over_<arch>`` compare with, described
  as ``best of N: lr=..., weight_decay=...`` on the parent run (``recsys.reference.<arch>``) and on
  its own run (``recsys.reference``); every reference trial is in ``references.csv``.
- **Seed check**: the ``top`` best finished search trials (stopped early by patience or ASHA
  count too), each re-trained with ``seeds`` new seeds (``train.seed`` + 1 .. + N: init, data
  order and every random draw; the data itself is the same). Statistics: ``recsys.tune.confirm``.
  Its K x N points come from the search's ranking and are kept in its own Tune state, so a
  resumed check re-trains exactly those.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd

from recsys.runtime import storage
from recsys.runtime.storage import ray_storage
from recsys.tracking.tracker import Tag, Tracker
from recsys.tune import confirm
from recsys.tune.confirm import Spread, spread
from recsys.tune.driver_log import driver_callbacks
from recsys.tune.references import Walk
from recsys.tune.results import SCORED, TRAINED_TO_END, status
from recsys.tune.space import SearchSpace
from recsys.tune.state import SweepOptions, sweep_dir
from recsys.tune.trial import (
    CONFIRMS,
    TrialSpec,
    reuse_actors,
    run_trial,
    trial_cpus,
    trial_failures,
)

PHASE_DIRS = {"confirm": "confirm"}
CONFIRMABLE = SCORED
REFERENCE = "reference"  # the frame's column describing a chosen reference


def trainable(opts: SweepOptions, spec: TrialSpec) -> Any:
    """The Tune trainable of a phase's trials (``run_trial`` with the phase's spec)."""
    from ray import tune

    trainable = tune.with_parameters(run_trial, spec=spec.to_dict())
    return tune.with_resources(trainable, {"CPU": trial_cpus(spec, opts.driver_cpus)})


def registered(opts: SweepOptions, spec: TrialSpec, role: str) -> str:
    """``trainable(opts, spec)`` with the role ``role``, registered with Tune as
    ``recsys-<role>``: every experiment of a sweep names its trainable, because the references'
    thread runs beside the search and Tune's registry is not safe to write from two threads
    (``recsys.tune.baselines``); call it from the driver's thread before that one starts."""
    from ray.tune.registry import register_trainable

    name = f"recsys-{role}"
    register_trainable(name, trainable(opts, dataclasses.replace(spec, role=role)))
    return name


def phase_steps(space: SearchSpace, points: list[dict[str, Any]], workers: int) -> int:
    """The steps a phase's trials train to, for its progress lines: the first point's budget
    (made steps for ``workers`` workers when it is in epochs), else the base's."""
    if not points:
        return space.base.train.steps
    cfg = space.config_for({k: v for k, v in points[0].items() if not k.startswith("_")})
    if cfg.train.epochs <= 0:
        return cfg.train.steps
    from recsys.data.dataset import train_rows, with_budget

    return with_budget(cfg, train_rows(cfg), workers).train.steps


def confirm_points(trials: pd.DataFrame, space: SearchSpace) -> list[dict[str, Any]]:
    """``top`` x ``seeds`` params: each of the best search trials' params with a new seed and
    the trial's id (``CONFIRMS``)."""
    score = space.objectives[0].key
    if trials.empty:
        return []
    done = trials[trials["status"].isin(CONFIRMABLE) & trials[score].notna()]
    points = []
    for _, row in done.head(space.confirm.top).iterrows():
        params = dict(row["params"])
        seed = space.config_for(params).train.seed
        points += [
            {**params, "train.seed": seed + 1 + j, CONFIRMS: str(row["trial"])}
            for j in range(space.confirm.seeds)
        ]
    return points


REFERENCE_OF = "_reference_of"  # in a reference's seed-check params: the arch it is the best of


def reference_points(baselines: pd.DataFrame, space: SearchSpace) -> list[dict[str, Any]]:
    """``seeds`` params for each reference: its arch's best baseline trial (``baselines`` ranked,
    with a score) with the fixed keys of its rules (``Reference.fixed``), a new seed and the
    trial's id (``CONFIRMS``)."""
    score = space.objectives[0].key
    if baselines.empty:
        return []
    done = baselines[baselines["status"].isin(TRAINED_TO_END) & baselines[score].notna()]
    points = []
    for _, row in done[~done.duplicated("arch", keep="first")].iterrows():
        ref = space.references[str(row["arch"])]
        params = {**ref.fixed(space.base), **dict(row["params"])}
        seed = space.config_for(params).train.seed
        points += [
            {**params, "train.seed": seed + 1 + j, CONFIRMS: str(row["trial"]),
             REFERENCE_OF: str(row["arch"])}
            for j in range(space.confirm.seeds)
        ]  # fmt: skip
    return points


def phase_tuner(
    role: str,
    points: list[dict[str, Any]],
    space: SearchSpace,
    opts: SweepOptions,
    spec: TrialSpec,
    restore: bool,
    folder: str = "",
) -> Any:
    """The phase's ``Tuner``: restored from ``<sweep>/<folder>`` (default: the phase's,
    ``PHASE_DIRS``) if it has state, else a grid over ``points`` (one trial each), FIFO,
    ``--max-concurrent`` at a time."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from recsys.tune.progress import Progress

    phase_spec = dataclasses.replace(spec, role=role)
    folder = folder or PHASE_DIRS[role]
    path, fs = ray_storage(storage.join(sweep_dir(opts), folder))
    if restore and tune.Tuner.can_restore(path, storage_filesystem=fs):
        return tune.Tuner.restore(
            path, trainable=f"recsys-{role}", resume_unfinished=True,
            resume_errored=True, storage_filesystem=fs,
        )  # fmt: skip
    score = space.objectives[0]
    steps = phase_steps(space, points, opts.num_workers)
    progress = Progress(space.metric, steps, mode=score.mode, total=len(points), label=role)
    return tune.Tuner(
        f"recsys-{role}",
        param_space={"params": tune.grid_search(points)},
        tune_config=tune.TuneConfig(
            metric=score.key,
            mode=score.mode,
            search_alg=BasicVariantGenerator(max_concurrent=opts.max_concurrent),
            reuse_actors=reuse_actors(),  # (FIFO)
        ),
        run_config=tune.RunConfig(
            name=folder,
            storage_path=ray_storage(sweep_dir(opts))[0],
            storage_filesystem=fs,
            verbose=0,
            callbacks=[progress, *driver_callbacks(phase_spec, steps)],
            failure_config=trial_failures(phase_spec),
        ),
    )


def confirm_folder(growth: int) -> str:
    """The seed check's folder after the search's ``growth``-th growth (0: the first search)."""
    return PHASE_DIRS["confirm"] + (f"-{growth}" if growth else "")


def seed_check(
    space: SearchSpace,
    opts: SweepOptions,
    spec: TrialSpec,
    restore: bool,
    trials: pd.DataFrame,
    baselines: pd.DataFrame | None = None,
    grown: int = 0,
) -> pd.DataFrame:
    """The seed check of the ``top`` best of ``trials`` (one row per seed run: ``confirm_frame``),
    and with ``confirm.references`` of each reference among ``baselines`` (its arch's best).
    In a sweep ``grown`` times, seed runs an earlier check made (its folder restored) are kept
    and not run again; the new ones run in the last growth's folder (``confirm_folder``)."""
    points = confirm_points(trials, space) if space.confirm.top else []
    if points and space.confirm.references and baselines is not None:
        points += reference_points(baselines, space)
    if not points:
        return pd.DataFrame()
    n = grown  # the sweep's growths: the earlier checks are in confirm_folder(0 .. n - 1)
    frames = [confirm_frame(tuner.fit(), space) for j in range(n)
              if (tuner := restored_phase(confirm_folder(j), opts, spec)) is not None]  # fmt: skip
    done = {(str(r["confirms"]), int(r["seed"])) for f in frames for _, r in f.iterrows()}
    new = [p for p in points if (str(p[CONFIRMS]), int(p["train.seed"])) not in done]
    top, seeds = len(points) // space.confirm.seeds, space.confirm.seeds
    before = len(points) - len(new)
    made = f" ({before} of the runs made before)" if before else ""
    refs = len({p[CONFIRMS] for p in points if p.get(REFERENCE_OF)})
    what = f"the {top - refs} best trials" + (f" and {refs} references" if refs else "")
    print(f"seed check: {what}, {seeds} new seeds each{made}")
    if new:
        grid = phase_tuner("confirm", new, space, opts, spec, restore, confirm_folder(n)).fit()
        frames.append(confirm_frame(grid, space))
    frame = pd.concat(frames, ignore_index=True)
    wanted = {str(p[CONFIRMS]) for p in points}
    return frame[frame["confirms"].astype(str).isin(wanted)].reset_index(drop=True)


def restored_phase(folder: str, opts: SweepOptions, spec: TrialSpec) -> Any:
    """The Tuner of a phase that ran in ``<sweep>/<folder>``, restored (None if it has no state)."""
    from ray import tune

    path, fs = ray_storage(storage.join(sweep_dir(opts), folder))
    if not tune.Tuner.can_restore(path, storage_filesystem=fs):
        return None
    return tune.Tuner.restore(
        path, trainable="recsys-confirm", resume_unfinished=True,
        resume_errored=True, storage_filesystem=fs,
    )  # fmt: skip


def confirm_frame(result_grid: Any, space: SearchSpace) -> pd.DataFrame:
    """One row per seed-check trial: the trial it re-trains, its seed, status and score."""
    score = space.objectives[0].key
    rows = []
    for result in result_grid:
        last, params = result.metrics or {}, dict((result.config or {}).get("params", {}))
        rows.append({
            "trial": last.get("trial_id", ""),
            "confirms": params.get(CONFIRMS, ""),
            "seed": params.get("train.seed"),
            "status": status(result, last, space.base.train.steps),
            score: last.get(score, float("nan")),
            "worker_s": last.get("worker_s", float("nan")),
        })  # fmt: skip
    return pd.DataFrame(rows)


def spreads(seeds: pd.DataFrame, space: SearchSpace) -> tuple[list[Spread], list[str]]:
    """Each confirmed configuration's ``Spread`` over its finished seed runs, and a line for
    each one with fewer than two (no interval without two values)."""
    score = space.objectives[0].key
    out: list[Spread] = []
    short: list[str] = []
    if seeds.empty:
        return out, short
    ok = seeds[seeds["status"].isin(CONFIRMABLE) & seeds[score].notna()]
    for trial in dict.fromkeys(seeds["confirms"]):
        values = ok.loc[ok["confirms"] == trial, score].astype(float).tolist()
        if len(values) >= 2:
            out.append(spread(trial, values))
        else:
            short.append(f"  {trial}: {len(values)} seed run(s) finished; no interval")
    return out, short


def chosen_references(
    frame: pd.DataFrame, space: SearchSpace, walks: dict[str, Walk] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``frame`` (ranked) with each reference arch's trials reduced to its best trained to its
    end (``TRAINED_TO_END``: never one stopped at a rung; its ``reference`` column says of
    how many, with what, and how far its grid's edges were walked: ``walks``), and every
    reference trial (``chosen`` marks the kept ones)."""
    if frame.empty or "role" not in frame or not (frame["role"] == "baseline").any():
        return frame, pd.DataFrame()
    refs = frame[frame["role"] == "baseline"].copy()
    ended = refs["status"].isin(TRAINED_TO_END)
    firsts = refs[ended].drop_duplicates("arch", keep="first").index
    refs["chosen"] = refs.index.isin(firsts)
    described = []
    for _, row in refs.iterrows():
        arch = str(row["arch"])
        ref, mine = space.references.get(arch), ended[refs["arch"] == arch]
        n, cut = int(mine.sum()), int((~mine).sum())
        params = dict(row["params"])
        what = ref.describe(params) if ref is not None else ""
        head = f"best of {n}" + (f" ({cut} more cut short)" if cut else "")
        walked = walks[arch].summary(params) if walks and arch in walks else ""
        described.append(f"{head}: {what}" + (f"; {walked}" if walked else "") if what else head)
    refs[REFERENCE] = described
    kept = refs[refs["chosen"]].drop(columns="chosen")
    out = pd.concat([frame[frame["role"] != "baseline"], kept], ignore_index=False)
    return out.sort_index().reset_index(drop=True), refs.reset_index(drop=True)


@dataclasses.dataclass(frozen=True)
class Winner:
    """The best model of a sweep: ``kind`` ``search`` (a trial of the search) or ``reference``,
    its ``arch`` and trial id (MLflow: ``recsys.winner`` on the sweep's run)."""

    kind: str
    arch: str
    trial: str

    def tag(self) -> str:
        what = "the search's best" if self.kind == "search" else "a reference"
        return f"{self.arch} ({what}, trial {self.trial})"


class Outcome:
    """What a sweep's phases found: the search's rows and each reference's best in one ranking
    (``frame``; every reference trial in ``references``), the seed runs (``seeds``), each
    confirmed search configuration's spread, best mean first (``spreads``), each seed-checked
    reference's (``reference_spreads``, by arch), and the best search trial (by confirmed mean
    when the seed check ran)."""

    def __init__(
        self, frame: pd.DataFrame, seeds: pd.DataFrame, space: SearchSpace,
        walks: dict[str, Walk] | None = None,
    ) -> None:  # fmt: skip
        frame, self.references = chosen_references(frame, space, walks)
        self.frame, self.seeds, self.space = frame, seeds, space
        found, self.short = spreads(seeds, space)
        trials = frame[frame["role"] == "trial"] if not frame.empty else frame
        ids = set(trials["trial"]) if not trials.empty else set()
        self.spreads = confirm.ranked([s for s in found if s.trial in ids], space.mode)
        arch = {str(r["trial"]): str(r["arch"]) for _, r in self.baselines.iterrows()}
        self.reference_spreads = {arch[s.trial]: s for s in found if s.trial in arch}
        self.best = trials.iloc[0] if not trials.empty else None
        if self.spreads:
            self.best = trials[trials["trial"] == self.spreads[0].trial].iloc[0]

    @property
    def baselines(self) -> pd.DataFrame:
        return self.frame[self.frame["role"] == "baseline"] if not self.frame.empty else self.frame

    def best_value(self) -> tuple[float, str]:
        """The best search trial's score and what it is (its confirmed mean when checked)."""
        assert self.best is not None
        if self.spreads:
            return self.spreads[0].mean, f"confirmed mean of {self.spreads[0].n} seeds"
        return float(self.best[self.space.objectives[0].key]), "its best report"

    def reference_value(self, row: Any) -> float:
        """A reference's score: its seed-checked mean where it was, else its best report."""
        checked = self.reference_spreads.get(str(row["arch"]))
        return checked.mean if checked else float(row[self.space.objectives[0].key])

    def leads(self) -> dict[str, float]:
        """The best trial's lead over each baseline (positive: better), by the space's mode."""
        if self.best is None:
            return {}
        value, _ = self.best_value()
        sign = 1.0 if self.space.mode == "max" else -1.0
        return {
            str(row["arch"]): sign * (value - self.reference_value(row))
            for _, row in self.baselines.iterrows()
            if math.isfinite(self.reference_value(row))
        }

    def separations(self) -> dict[str, confirm.Separation]:
        """The best's lead over each seed-checked reference, with Welch's interval of it."""
        if not self.spreads:
            return {}
        best, mode = self.spreads[0], self.space.mode
        return {a: confirm.separation(best, s, mode) for a, s in self.reference_spreads.items()}

    def verdicts(self) -> dict[str, str]:
        """Each baseline's verdict against the best trial: ``beats``, ``ties`` (the lead is
        inside the seed noise: for a seed-checked reference, the interval of the difference
        includes 0; else the best's interval includes the reference's score) or ``does not
        beat``."""
        out = {}
        key, seps = self.space.objectives[0].key, self.separations()
        for _, row in self.baselines.iterrows():
            arch, lead = str(row["arch"]), self.leads().get(str(row["arch"]))
            if lead is None:
                continue
            if arch in seps:
                sep = seps[arch]
                out[arch] = "beats" if sep.low > 0 else "does not beat" if sep.high < 0 else "ties"
            elif self.spreads and self.spreads[0].low <= float(row[key]) <= self.spreads[0].high:
                out[arch] = "ties"
            else:
                out[arch] = "beats" if lead > 0 else "does not beat"
        return out

    def verdict_text(self, arch: str) -> str:
        """``arch``'s verdict with its lead and, when seed-checked, the interval it was judged by
        (the MLflow tag ``recsys.verdict.<arch>``)."""
        verdict, lead = self.verdicts()[arch], self.leads()[arch]
        if arch in (seps := self.separations()):
            sep = seps[arch]
            interval = f"[{sep.low:+.4f}, {sep.high:+.4f}]"
            return f"{verdict}: lead {lead:+.4f}, {confirm.LEVEL:.0%} CI {interval} (both checked)"
        if not self.spreads:
            return f"{verdict}: lead {lead:+.4f}"
        s = self.spreads[0]
        interval = f"{confirm.LEVEL:.0%} CI [{s.low:.4f}, {s.high:.4f}]"
        return f"{verdict}: lead {lead:+.4f}, the best's {interval}"

    def lines(self) -> str:
        """The summary below the table: first, where a reference beats the search's best (and so
        every trial of the search), that it does; the seed check's verdict; the baselines."""
        out = self.reference_wins()
        metric = self.space.metric
        if self.spreads or self.short:
            out.append(
                f"\nseed check ({metric} of the new seeds' runs; the search's run left out):"
            )
            out += [confirm.verdict(self.spreads, self.space.mode, metric)] if self.spreads else []
            out += self.short
        if self.best is not None and not self.baselines.empty:
            out += self.baseline_lines()
        return "\n".join(out)

    def beating_references(self) -> list[str]:
        """The references the search's best trial does not beat and trails (verdict ``does not
        beat``: outside the seed noise where the seed check ran), the strongest first."""
        if self.best is None or self.baselines.empty:
            return []
        verdicts, leads = self.verdicts(), self.leads()
        losses = [a for a, v in verdicts.items() if v == "does not beat" and leads[a] < 0]
        return sorted(losses, key=leads.__getitem__)

    def winner(self) -> Winner | None:
        """The best model of the sweep, whatever its kind: the strongest reference the search's
        best does not beat (``beating_references``), else the search's best trial."""
        if self.best is None:
            return None
        if losses := self.beating_references():
            row = self.baselines[self.baselines["arch"] == losses[0]].iloc[0]
            return Winner("reference", str(row["arch"]), str(row["trial"]))
        return Winner("search", str(self.best["arch"]), str(self.best["trial"]))

    def reference_wins(self) -> list[str]:
        """The headline where a reference does better than the search's best trial, outside the
        noise: the best model of the sweep is that reference, and the export takes it."""
        losses, leads = self.beating_references(), self.leads()
        if not losses:
            return []
        winner = self.winner()
        assert winner is not None and self.best is not None
        value, what = self.best_value()
        by = ", ".join(f"{a} by {-leads[a]:.4f}" for a in losses)
        basis = "beyond the seed noise" if self.spreads else "by single reports, no seed check"
        return [
            f"\nthe best model here is {winner.arch} (the reference, trial {winner.trial}): no "
            f"trial of the search beats {' or '.join(losses)} (best trial {self.best['trial']}, "
            f"{what}: {self.space.metric} {value:.4f}; trails {by}, {basis}); --export and "
            f"recsys-export --sweep take it; --more N --widen looks further for a model that "
            f"beats it"
        ]

    def baseline_lines(self) -> list[str]:
        """The best trial against each reference: its verdict, its lead and what it is judged by
        (the difference's interval where both were seed-checked, else the best's)."""
        assert self.best is not None
        value, what = self.best_value()
        metric, seps = self.space.metric, self.separations()
        out = [f"\nagainst the baselines (best trial {self.best['trial']}, {what}: "
               f"{value:.4f}):"]  # fmt: skip
        leads, verdicts = self.leads(), self.verdicts()
        for _, row in self.baselines.iterrows():
            arch = str(row["arch"])
            lead, verdict = leads.get(arch), verdicts.get(arch)
            how = f", {row[REFERENCE]}" if isinstance(row.get(REFERENCE), str) else ""
            checked = self.reference_spreads.get(arch)
            score = (f"confirmed mean {checked.mean:.4f} of {checked.n} seeds" if checked
                     else f"{self.reference_value(row):.4f}")  # fmt: skip
            ref = f"{arch} (trial {row['trial']}{how}) {metric} {score}"
            if lead is None:
                out.append(f"  {ref}: no score ({row['status']})")
            elif arch in seps:
                sep, pct = seps[arch], f"{confirm.LEVEL:.0%}"
                words = {"beats": "beats", "ties": "ties", "does not beat": "does NOT beat"}
                out.append(f"  {words[verdict or 'ties']} {ref}: lead {lead:+.4f}, {pct} CI "
                           f"[{sep.low:+.4f}, {sep.high:+.4f}] of the difference")  # fmt: skip
            elif verdict == "ties":
                s = self.spreads[0]
                out.append(
                    f"  ties {ref}: lead {lead:+.4f} is inside the seed noise (the best's "
                    f"{confirm.LEVEL:.0%} CI [{s.low:.4f}, {s.high:.4f}] includes "
                    f"{self.reference_value(row):.4f})"
                )
            elif verdict == "beats":
                out.append(f"  beats {ref} by {lead:+.4f}")
            else:
                out.append(f"  does NOT beat {ref}: {lead:+.4f}")
        if self.spreads and len(seps) < len(self.baselines):
            std = self.spreads[0].std
            out.append(f"  (a reference not seed-checked is the best of its own runs; the best's "
                       f"seed std is {std:.4f}; a reference inside the best's interval is a "
                       f"tie; --confirm-references seed-checks them too)")  # fmt: skip
        return out


def log_references(tracker: Tracker, parent: str, experiment_id: str, result: Outcome) -> None:
    """The references on the parent run (``references.csv``: every reference trial, ``chosen``
    marking each arch's best; a tag ``recsys.reference.<arch>``: its trial and how it was
    chosen) and on each reference trial's run (``recsys.reference``: ``best of N: ...`` on the
    chosen, ``candidate`` on the others)."""
    refs = result.references
    if refs.empty:
        return
    tracker.log_text(parent, refs.drop(columns="params").to_csv(index=False), "references.csv")
    tags = {}
    for _, row in refs.iterrows():
        chosen = bool(row["chosen"])
        if chosen:
            tags[f"{Tag.REFERENCE}.{row['arch']}"] = f"trial {row['trial']}, {row[REFERENCE]}"
        run = tracker.find_trial_run(experiment_id, str(row["trial"])) if row["trial"] else None
        if run is not None:
            mark = row[REFERENCE] if chosen else "candidate"
            tracker.set_tags(run.info.run_id, {Tag.REFERENCE: mark})
    tracker.set_tags(parent, tags)


def log_confirmation(tracker: Tracker, parent: str, experiment_id: str, result: Outcome) -> None:
    """The later phases on the parent run: the references (``log_references``), then the seed
    check (CSVs, the order by confirmed mean, whether the top two are separable) and on each
    confirmed trial's run (its mean, std and interval)."""
    log_references(tracker, parent, experiment_id, result)
    if result.seeds.empty:
        return
    tracker.log_text(parent, result.seeds.to_csv(index=False), "confirm.csv")
    if not result.spreads:
        tracker.set_tags(parent, {Tag.CONFIRMED_ORDER: "[]"})  # (an earlier check's is stale)
        return
    checked = [(s, "") for s in result.spreads]
    checked += [(s, arch) for arch, s in result.reference_spreads.items()]
    table = pd.DataFrame(
        [{"trial": s.trial, "reference": arch, "n": s.n, "mean": s.mean, "std": s.std,
          "low": s.low, "high": s.high} for s, arch in checked]
    )  # fmt: skip
    tracker.log_text(parent, table.to_csv(index=False), "confirmed.csv")
    tags = {Tag.CONFIRMED_ORDER: json.dumps([s.trial for s in result.spreads])}
    if len(result.spreads) >= 2:
        sep = confirm.separation(result.spreads[0], result.spreads[1], result.space.mode)
        tags[Tag.SEPARABLE] = "yes" if sep.separable else "no"
        tracker.log_values(parent, {"confirmed_lead": sep.lead, "confirmed_lead_low": sep.low})
    tracker.set_tags(parent, tags)
    metric = result.space.metric
    for s, _ in checked:
        run = tracker.find_trial_run(experiment_id, s.trial)
        if run is not None:
            stats = {"mean": s.mean, "std": s.std, "low": s.low, "high": s.high}
            values = {f"confirmed_{k}_{metric}": v for k, v in stats.items()}
            tracker.log_values(run.info.run_id, values)

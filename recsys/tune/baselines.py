"""The baselines phase: each reference model of a space searched by its rules
(``recsys.tune.references``), beside the search.

- **Beside the search**: where the cluster holds a reference's trial beside the search's
  ``--max-concurrent`` ones (``room_beside``), the references run in a thread of the sweep's
  driver while the search runs in its main thread (``Beside``), instead of a phase before the
  first search trial; elsewhere (one trial at a time: a laptop) they run first. Both are Tune
  experiments of their own; Tune's trainables are registered by name before the thread starts
  (its registry is not safe to write from two threads).
- **Side by side**: the references share the ``--max-concurrent`` trials among them (``lanes``):
  with 2 at a time and LR and FM, each reference's grid runs one trial at a time, both at once,
  instead of LR's grid two at a time and then FM's: a grid's odd last trial or an edge's single
  step no longer runs beside an empty slot (BENCHMARKS.md, quickstart); once one reference has
  ended, its slot waits for the other's end. The trials at once stay ``--max-concurrent``.
- **Successive halving**: unless the sweep's scheduler is FIFO, each reference's grid but a
  solved one's (``halves``) trains in rounds (``halving``), each a Tune experiment of its own
  (``baselines-<arch>``, then ``-rung-<k>``): every point to the first rung (one epoch with a
  budget in epochs, else two reports; ``rungs``), where it pauses with its checkpoint
  (``train.pause_at``); the best third go on from there to the next rung (``REDUCTION`` times
  further), and so on, the last round to the budget's end. A point keeps its MLflow run and its
  training across the rounds (its id: ``POINT``), so it trains on as one uninterrupted run
  would. The reference is the best point trained to its end (finished, converged or stopped by
  patience; never one paused at a rung). Unlike ASHA's asynchronous rungs, where the first
  trials to reach a rung always go on, every point is compared with all the others at the same
  rung.
- **Edges**: where that best sits on an edge of a numeric grid key, one point a step beyond it
  runs (``baselines-<arch>-edge-<k>``), and so on until the best is inside or the walk reached
  its bound (``Walk``). Under halving, a step's point pauses at each rung too, and goes on only
  where it ranks among the best third of every point at that rung (as though it had been in the
  grid); one that does not leaves the best where it was, now inside. Under the smoke variant no
  edge is walked.

A resumed sweep restores each experiment from its folder and walks the same edges again from
the same results; a grown sweep (``--more``) reads them without training.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from recsys.config import ExperimentConfig
from recsys.runtime import storage
from recsys.runtime.lanes import in_lanes
from recsys.runtime.storage import ray_storage
from recsys.tune.driver_log import driver_callbacks
from recsys.tune.references import MAX_EDGE_STEPS, Reference, Walk
from recsys.tune.results import (
    PAUSE,
    POINT,
    STOPPED,
    TRAINED_TO_END,
    best_columns,
    trial_frame,
)
from recsys.tune.space import SearchSpace
from recsys.tune.state import SweepOptions, sweep_dir
from recsys.tune.trial import TrialSpec, reuse_actors, trial_config, trial_failures

REDUCTION = 3  # successive halving over a reference's grid: a third go on at each rung


def folder_of(arch: str, edge: int = 0) -> str:
    """The Tune experiment of ``arch``'s grid (``edge`` 0) or of its ``edge``-th walk step."""
    return f"baselines-{arch}" + (f"-edge-{edge}" if edge else "")


def round_folder(folder: str, k: int) -> str:
    """The Tune experiment of round ``k`` of a grid's successive halving (0: ``folder``)."""
    return folder + (f"-rung-{k}" if k else "")


def rungs(cfg: ExperimentConfig) -> list[int]:
    """The steps where successive halving pauses a reference's points (``cfg``: a point's
    trial config, ``trial_config``: its budget in steps): from one epoch with a budget in epochs
    (else two reports), ``REDUCTION`` times further each, before the budget's last step; each
    the first report at or past it (a multiple of ``checkpoint_every``). As ASHA's rungs."""
    tc = cfg.train
    every = tc.checkpoint_every or tc.steps
    at = tc.steps / tc.epochs if tc.epochs > 0 else 2.0 * every
    out: list[int] = []
    while (step := math.ceil(at / every - 1e-9) * every) < tc.steps:
        if not out or step > out[-1]:
            out.append(step)
        at *= REDUCTION
    return out


def halves(ref: Reference, scheduler: str) -> bool:
    """Whether ``ref``'s grid trains under successive halving: where the sweep's scheduler is
    not FIFO, but for a solved reference (LR by L-BFGS). Its early iterations rank its L2
    strengths by how soon each converges, not by where: on the demo log of 80k rows halving
    chose an L2 ten times too strong, 0.008 below the full grid."""
    return scheduler != "fifo" and not ref.solved


def survivors(pool: pd.DataFrame, mine: set[str]) -> list[str]:
    """The points ``mine`` (their ``trial`` ids: a round's) that go on to the next rung: in
    ``pool``, every point's row of that round ranked (a walk's step with its grid's, as though
    it had been in it), among the best ``max(1, len // REDUCTION)``, those paused at the rung
    (the others have ended: finished, converged or stopped early)."""
    best = pool.head(max(1, len(pool) // REDUCTION))
    return [str(t) for t, s in zip(best["trial"], best["status"], strict=True)
            if t in mine and s == STOPPED]  # fmt: skip


def room_beside(opts: SweepOptions, nodes: list[dict[str, float]]) -> bool:
    """Whether the cluster holds a reference's trial beside the ``--max-concurrent`` trials of
    the search: ``max_concurrent + 1`` trials' workers and drivers at once. Where it does not,
    the references run first (two trials waiting on each other's workers would wait forever)."""
    from recsys.runtime.cluster import placeable_workers

    trials = opts.max_concurrent + 1
    gpus = 1.0 if opts.use_gpu else 0.0
    cpus = sum(n.get("CPU", 0.0) for n in nodes)
    need = trials * (opts.num_workers * opts.cpus_per_worker + opts.driver_cpus)
    workers = placeable_workers(nodes, opts.cpus_per_worker, gpus)
    return cpus + 1e-9 >= need and workers >= trials * opts.num_workers


def lanes(slots: int, archs: int) -> tuple[int, int]:
    """How ``archs`` references share ``slots`` trials at once: ``(together, each)``, the
    references searched at once and the trials each runs at a time (``together * each <=
    slots``; one reference at a time, with every slot, where there is one reference or slot)."""
    together = max(1, min(slots, archs))
    return together, max(1, slots // together)


def header(space: SearchSpace, scheduler: str, beside: bool = True, slots: int = 1) -> str:
    """The console's line as the references start: each one, its trials and how it trains
    (``slots``: the trials the references may run at once, ``lanes``)."""
    refs = [space.references[a] for a in space.baselines]
    parts = ", ".join(f"{r.arch} ({r.trials} trial{'s' if r.trials > 1 else ''}, {r.label()})"
                      for r in refs)  # fmt: skip
    when = ("beside the search" if beside else
            "before the search (the cluster holds no trial beside the search's)")  # fmt: skip
    together, each = lanes(slots, len(refs))
    if together > 1:
        when += f"; {together} side by side, {each} trial{'s' if each > 1 else ''} at a time each"
    halving = [r.arch for r in refs if halves(r, scheduler)]
    rule = f"the best 1/{REDUCTION} go on at each rung"
    halved = f", {', '.join(halving)} under successive halving ({rule})" if halving else ""
    walked = any(r.edges for r in refs)
    walks = f" its grid's edges walked (at most {MAX_EDGE_STEPS} steps a side)," if walked else ""
    return (f"baselines: {parts}; {when}{halved}; each the best of its trials "
            f"trained to their end,{walks} by {space.metric}")  # fmt: skip


def best_trained(frame: pd.DataFrame, space: SearchSpace) -> pd.Series | None:
    """The best row (``frame`` ranked) trained to its end with a score; None without one."""
    if frame.empty:
        return None
    key = space.objectives[0].key
    done = frame[frame["status"].isin(TRAINED_TO_END) & frame[key].notna()]
    return done.iloc[0] if not done.empty else None


@dataclasses.dataclass
class Run:
    """What one reference's search needs: the space, the sweep's options and trial spec, whether
    its experiments may be restored, and whether they are only read (a part before a growth)."""

    space: SearchSpace
    opts: SweepOptions
    spec: TrialSpec
    restore: bool
    finished: bool = False

    def spec_of(self, ref: Reference) -> TrialSpec:
        """The spec of ``ref``'s trials: the sweep's, its role ``baseline``, its base config
        with the keys every one of its trials sets (``Reference.fixed``, the arch included)."""
        base = ExperimentConfig.from_dict(self.spec.base).with_overrides(ref.fixed(self.space.base))
        return dataclasses.replace(self.spec, role="baseline", base=base.to_dict())

    def trainable(self, ref: Reference) -> str:
        """The name ``register`` gave ``ref``'s trainable."""
        return f"recsys-baseline-{ref.arch}"

    def register(self) -> None:
        """Register every reference's trainable by name, in the driver's thread (Tune's
        registry is not safe to write from two threads)."""
        from ray.tune.registry import register_trainable

        from recsys.tune.phases import trainable

        for arch in self.space.baselines:
            ref = self.space.references[arch]
            register_trainable(self.trainable(ref), trainable(self.opts, self.spec_of(ref)))


def tuner_of(
    run: Run, ref: Reference, points: list[dict[str, Any]], folder: str, t0: float = 0.0
) -> Any:
    """The Tune experiment ``folder`` of ``ref``'s ``points`` (its grid values, or a walk's
    step; each trained to its end or to its ``PAUSE``): restored from its folder where it has
    state, else new (``None`` when only read and absent). Its trials' params are the arch and the
    grid's values (the console line, the ``recsys.searched`` tag); the keys they all set are in
    their spec's base (``Run.spec_of``). FIFO, its trials' actors reused; its console lines
    timed from ``t0`` (0: now)."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from recsys.tune.progress import Progress

    spec = run.spec_of(ref)
    path, fs = ray_storage(storage.join(sweep_dir(run.opts), folder))
    if run.restore and tune.Tuner.can_restore(path, storage_filesystem=fs):
        return tune.Tuner.restore(path, trainable=run.trainable(ref), resume_unfinished=True,
                                  resume_errored=True, storage_filesystem=fs)  # fmt: skip
    if run.finished:
        return None
    steps = trial_config(spec, points[0]).train.steps
    score = run.space.objectives[0]
    progress = Progress(run.space.metric, steps, mode=score.mode, total=len(points),
                        label="baseline", table=False, t0=t0)  # fmt: skip
    scheduler = FIFOScheduler()
    return tune.Tuner(
        run.trainable(ref),
        param_space={"params": tune.grid_search(points)},
        tune_config=tune.TuneConfig(
            metric=score.key, mode=score.mode,
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(max_concurrent=run.opts.max_concurrent),
            reuse_actors=reuse_actors(scheduler),
        ),
        run_config=tune.RunConfig(
            name=folder, storage_path=ray_storage(sweep_dir(run.opts))[0], storage_filesystem=fs,
            verbose=0, callbacks=[progress, *driver_callbacks(spec, steps)],
            failure_config=trial_failures(spec),
        ),
    )  # fmt: skip


def at(pauses: list[int], k: int) -> int:
    """A point's pause in round ``k``: its ``k``-th rung (0 past its last: to its end)."""
    return pauses[k] if k < len(pauses) else 0


def halving(
    run: Run,
    ref: Reference,
    points: list[dict[str, Any]],
    folder: str,
    halve: bool,
    rounds: dict[int, pd.DataFrame],
    t0: float,
) -> pd.DataFrame:
    """``ref``'s ``points`` trained in the rounds of successive halving (``rungs``; where not
    ``halve``, one round to the end): each round a Tune experiment (``round_folder``), its points
    paused at its rung, the ``survivors`` (against the earlier points' rows of each round,
    ``rounds``, which takes this one's) trained on in the next. Each point's row of its latest
    round (its ``trial``: its ``POINT``, unique in the sweep), ranked. Its console lines are
    timed from ``t0``."""
    named = [{"model.arch": ref.arch, **p, POINT: f"{run.spec.sweep}-{folder}-{i}"}
             for i, p in enumerate(points)]  # fmt: skip
    spec = run.spec_of(ref)
    pauses = {p[POINT]: rungs(trial_config(spec, p)) if halve else [] for p in named}
    frames, going = [], named
    for k in range(1 + max(map(len, pauses.values()))):
        todo = [{**p, PAUSE: at(pauses[p[POINT]], k)} for p in going]
        tuner = tuner_of(run, ref, todo, round_folder(folder, k), t0)
        if tuner is None:
            break
        results = tuner.get_results() if run.finished else tuner.fit()
        frames.append(frame := trial_frame(results, run.space, role="baseline"))
        rounds[k] = pool = ranked_refs([rounds.get(k, pd.DataFrame()), frame], run.space)
        on = set(survivors(pool, set(frame["trial"]))) if not frame.empty else set()
        if not (going := [p for p in going if p[POINT] in on]):
            break
    return ranked_refs([across_rounds(frames, run.space)], run.space)


def across_rounds(frames: list[pd.DataFrame], space: SearchSpace) -> pd.DataFrame:
    """One row a point from its rounds' ``frames`` (in round order): its latest round's (its
    status, score, last step, cost), with the columns of its best report (``best_columns``: its
    step, metrics and checkpoint) from the round that holds it: the first whose score (the
    run's best so far, ``best_<metric>``, which each round's last report carries on) is the
    point's final one. Each round's Tune trial knows its own reports only."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    rounds = pd.concat(frames, ignore_index=True)
    key = space.objectives[0].key
    latest = rounds.iloc[::-1].drop_duplicates("trial").reset_index(drop=True)
    final = dict(zip(latest["trial"], latest[key], strict=True))
    holds = rounds[[final[t] == v for t, v in zip(rounds["trial"], rounds[key], strict=True)]]
    holds = holds.drop_duplicates("trial").set_index("trial")  # (a NaN score: none)
    found = latest["trial"].isin(holds.index)
    for c in (c for c in best_columns(space) if c in rounds):
        latest.loc[found, c] = latest.loc[found, "trial"].map(holds[c])
    return latest


def search_reference(run: Run, ref: Reference, t0: float = 0.0) -> tuple[pd.DataFrame, Walk]:
    """``ref``'s trials (its grid, then its walk's steps; ranked) and the walk. Under halving a
    walk's step is halved too, each of its points against the grid's and earlier steps' points
    at each rung: it goes on only where it would have gone on in the grid. Its console lines are
    timed from ``t0`` (0: its start), the walk's steps on the grid's clock."""
    t0 = t0 or time.time()
    walk = Walk({k: list(v) for k, v in ref.grid.items()})
    frames, edge = [], 0
    rounds: dict[int, pd.DataFrame] = {}  # round -> every point's row at its end, so far
    keys = list(ref.grid)
    points = [dict(zip(keys, c, strict=True)) for c in itertools.product(*ref.grid.values())]
    halve = halves(ref, run.opts.scheduler)
    while points:
        frames.append(halving(run, ref, points, folder_of(ref.arch, edge), halve, rounds, t0))
        frame = ranked_refs(frames, run.space)
        best = best_trained(frame, run.space)
        if not ref.edges or best is None:
            break
        edge += 1
        points = walk.next_points(dict(best["params"]))
    return ranked_refs(frames, run.space), walk


def ranked_refs(frames: list[pd.DataFrame], space: SearchSpace) -> pd.DataFrame:
    from recsys.tune.results import ranked

    frames = [f for f in frames if not f.empty]
    return ranked(pd.concat(frames, ignore_index=True), space) if frames else pd.DataFrame()


@dataclasses.dataclass
class Found:
    """The baselines phase's result: every reference trial (ranked), and each arch's walk."""

    frame: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    walks: dict[str, Walk] = dataclasses.field(default_factory=dict)


def search_references(run: Run, log: Callable[[str], None] = print) -> Found:
    """Every reference of the space (``search_reference``), side by side as ``lanes`` shares
    the sweep's ``--max-concurrent`` trials among them, a line each as it ends."""
    archs = list(run.space.baselines)
    together, each = lanes(run.opts.max_concurrent, len(archs))
    lane = dataclasses.replace(run, opts=dataclasses.replace(run.opts, max_concurrent=each))
    searched: dict[str, tuple[pd.DataFrame, Walk]] = {}
    t0 = time.time()  # the phase's clock, every reference's and walk's lines on it

    def one(arch: str) -> None:
        frame, walk = searched[arch] = search_reference(lane, run.space.references[arch], t0)
        log(done_line(arch, frame, walk, run.space))

    in_lanes(one, archs, together, name="references")
    return Found(frame=ranked_refs([searched[a][0] for a in archs], run.space),
                 walks={a: searched[a][1] for a in archs})  # fmt: skip


def done_line(arch: str, frame: pd.DataFrame, walk: Walk, space: SearchSpace) -> str:
    """``reference lr: best of 5 trained to their end (2 stopped at a rung): weight_decay=...``."""
    best = best_trained(frame, space)
    if best is None:
        return f"reference {arch}: no trial trained to its end with a score"
    stopped = int((frame["status"] == STOPPED).sum())
    cut = f" ({stopped} stopped at a rung)" if stopped else ""
    ref = space.references[arch]
    walked = walk.summary(dict(best["params"]))
    score = float(best[space.objectives[0].key])
    return (f"reference {arch}: {space.metric} {score:.4f}, best of {len(frame) - stopped} "
            f"trained to their end{cut}: {ref.describe(dict(best['params']))}"
            + (f"; {walked}" if walked else ""))  # fmt: skip


class Beside:
    """``search_references`` in a thread of the driver, while the caller runs the search:
    ``start()``, then ``result()`` (re-raising what the thread raised)."""

    def __init__(self, run: Run, log: Callable[[str], None] = print) -> None:
        self.run, self.log = run, log
        self.found: Found | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="references", daemon=True)

    def _main(self) -> None:
        try:
            self.found = search_references(self.run, self.log)
        except BaseException as e:  # (re-raised in the driver's thread)
            self.error = e

    def start(self) -> Beside:
        self.thread.start()
        return self

    def result(self) -> Found:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.found is not None
        return self.found

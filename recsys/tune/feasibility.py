"""Is a trial's configuration worth launching? Checked in the trial's driver, before any worker
starts: the tables' bytes against the space's budget (``constraints``), then TorchRec's planner,
run dry for the trial's workers with their real device memory (``Machine``), must find a plan
whose estimated bytes per worker fit. A refusal names the numbers.

    verdict = check(cfg, constraints={"emb_bytes_max": 2e6}, machine=m, world_size=2, local=2)
    if not verdict.ok: print(verdict.reason)
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

from recsys.config import ExperimentConfig
from recsys.distributed.sharding import Machine, planner, sharders
from recsys.models import ModelAndLoss, build_model, embedding_report
from recsys.models.embeddings import table_specs
from recsys.tune.space import CONSTRAINTS


@dataclass(frozen=True)
class Verdict:
    """``ok``, or why not; ``numbers``: what was compared (bytes)."""

    ok: bool
    reason: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"


def check_budget(cfg: ExperimentConfig, constraints: dict[str, float]) -> Verdict:
    report = embedding_report(cfg.tables)
    numbers = {"emb_bytes": float(report.bytes), "emb_params": float(report.params)}
    for name, limit in constraints.items():
        value = numbers[CONSTRAINTS[name]]
        if value > limit:
            reason = f"{CONSTRAINTS[name]} = {value:.4g} is over the space's {name} = {limit:.4g}"
            return Verdict(False, reason, numbers)
    return Verdict(True, numbers=numbers)


def check_plan(
    cfg: ExperimentConfig, machine: Machine, world_size: int, local_world_size: int
) -> Verdict:
    """A dry run of the planner (tables on ``meta``: nothing allocated)."""
    from torchrec.distributed.planner.types import PlannerError

    net = build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks), "meta")
    model = ModelAndLoss(net, cfg.loss)
    names = [s.name for s in table_specs(cfg.tables)]
    half = cfg.embeddings.dtype != "fp32"
    capacity = machine.hbm if machine.device == "cuda" and machine.hbm else machine.ddr
    numbers = {"device_bytes_per_worker": float(capacity)}
    torchrec_log = logging.getLogger("torchrec")
    level = torchrec_log.level
    torchrec_log.setLevel(logging.ERROR)  # the dry run's storage warnings say nothing here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p, estimate = planner(
                cfg.sharding, names, machine, world_size, local_world_size,
                cfg.train.batch_size, half,
            )  # fmt: skip
            p.plan(model, sharders(cfg.optim))
    except PlannerError as e:
        first = str(e).strip().splitlines()[0][:300]
        reason = (
            f"no sharding plan fits {world_size} worker(s) with {_gib(capacity)} each "
            f"({machine.device}): {first}"
        )
        return Verdict(False, reason, numbers)
    finally:
        torchrec_log.setLevel(level)
    per_rank = estimate.hbm if machine.device == "cuda" else estimate.ddr
    worst = float(max(per_rank.values(), default=0))
    numbers["plan_bytes_per_worker"] = worst
    if worst > capacity:
        reason = f"the plan needs {_gib(worst)} on a worker that has {_gib(capacity)}"
        return Verdict(False, reason, numbers)
    return Verdict(True, numbers=numbers)


def check(
    cfg: ExperimentConfig,
    constraints: dict[str, float],
    machine: Machine,
    world_size: int,
    local_world_size: int,
) -> Verdict:
    """The budget first (cheap), then the plan."""
    budget = check_budget(cfg, constraints)
    if not budget.ok:
        return budget
    plan = check_plan(cfg, machine, world_size, local_world_size)
    return Verdict(plan.ok, plan.reason, {**budget.numbers, **plan.numbers})

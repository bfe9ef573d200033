"""A full-batch convex solver for the reference models (``train.solver: lbfgs``): L-BFGS with a
strong-Wolfe line search on the whole training split, so that logistic regression reaches its
optimum for each L2 strength instead of wherever stochastic steps leave it.

The objective, for ``N`` training rows over all workers and ``lam = optim.weight_decay``::

    f(theta) = (1 / N) * sum_i loss_i(theta) + (lam / 2) * sum_p |theta_p|^2

the sum over every parameter but the biases (scikit-learn's ``LogisticRegression`` leaves its
intercept out alike). One solver step is one L-BFGS iteration (``torch.optim.LBFGS``,
``max_iter=1``, ``history_size`` 20), which evaluates ``f`` where it starts and its line search
a few times more; every
evaluation is one pass over each worker's own rows in order, ``train.batch_size`` rows at a time
(as many batches on every worker, the last padded with rows that count for nothing), each
backward's gradients averaged over the workers by DDP as in training. Every table must be a
replica (data-parallel, the ``dense`` kernel), so the whole model is one DDP's.
``samples_seen`` counts every row each evaluation reads (so ``epochs_done`` counts passes).

It starts from zero weights (``start_from_zero``; a resumed run from its checkpoint's).
Convergence: a step that changes ``f`` by less than ``TOLERANCE`` (relative) ends the run
(``converged``), as a solver's stopping rule; patience on the validation metric still applies. A
resumed run restarts L-BFGS's curvature memory from the checkpoint's weights: the optimum is the
same, the path to it a few iterations longer (the memory is not checkpointed).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torchrec.datasets.utils import Batch

from recsys.config import ExperimentConfig
from recsys.data import RowSource
from recsys.data.input.loader import eval_batches
from recsys.distributed import collectives
from recsys.distributed.env import WorkerEnv

TOLERANCE = 1e-9  # relative change of the objective at which a step ends the run
HISTORY = 20  # L-BFGS's curvature pairs
MAX_EVALUATIONS = 25  # of the objective in one iteration (its line search's budget: LBFGS's own
# default, 1.25 max_iter, would leave a one-iteration step no line search at all)


def penalised(name: str) -> bool:
    """Whether the L2 term covers a parameter: every one but the biases."""
    return not name.endswith("bias")


class FullBatchSolver:
    """``solver.step() -> f`` runs one L-BFGS iteration on ``model`` (a DMP over
    ``ModelAndLoss`` whose tables are all replicas) over this worker's part of ``train``.

    Args:
        model: the model; its parameters are what L-BFGS moves.
        train: the training split (every worker reads its ``shard_range``).
        cfg: the experiment (``optim.weight_decay``: lam; ``train.batch_size``: rows a pass
            reads at a time; the layout of its batches).
        env: this worker's ranks and device.
    """

    def __init__(
        self, model: nn.Module, train: RowSource, cfg: ExperimentConfig, env: WorkerEnv
    ) -> None:
        self.model, self.env, self.cfg = model, env, cfg
        self.train, self.rows = train, len(train)
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.lam = cfg.optim.weight_decay
        self.optimizer = torch.optim.LBFGS(
            [p for _, p in self.params], lr=1.0, max_iter=1, max_eval=MAX_EVALUATIONS,
            history_size=HISTORY,
            tolerance_grad=0.0, tolerance_change=0.0, line_search_fn="strong_wolfe",
        )  # fmt: skip
        self.evaluations = 0  # passes over the split (all workers' rows each)
        self.last = float("nan")

    def start_from_zero(self) -> None:
        """Every weight 0, as scikit-learn starts: the optimum does not depend on the start, but
        a row no training row reads is moved by the L2 term alone, and would keep what is left
        of its random start after any finite number of iterations."""
        with torch.no_grad():
            for _, p in self.params:
                p.zero_()

    def batches(self) -> Iterator[Batch]:
        """This worker's rows in order, ``train.batch_size`` at a time, as many batches on every
        worker (``eval_batches``); a padding row's label is NaN, so it adds nothing."""
        for batch, valid in eval_batches(
            self.train, rank=self.env.rank, world_size=self.env.world_size,
            batch_size=self.cfg.train.batch_size, layout=self.cfg.embeddings.layout(),
        ):  # fmt: skip
            batch.labels[~valid] = float("nan")
            yield batch.to(self.env.device)

    def objective(self) -> torch.Tensor:
        """``f`` at the current parameters, its gradient left in ``.grad`` (a closure for
        ``LBFGS.step``). Each backward's gradients are averaged over the workers (DDP, as in
        training), so a batch's mean loss is weighed by ``B * world_size / N``: the sum is the
        gradient of the mean over all ``N`` rows."""
        self.optimizer.zero_grad()
        total = torch.zeros((), dtype=torch.float64, device=self.env.device)
        for batch in self.batches():
            b = batch.labels.shape[0]
            loss, _ = self.model(batch)
            (loss * (b * self.env.world_size / self.rows)).backward()
            total += loss.detach().double() * b
        collectives.sum_(total)
        value = total / self.rows
        if self.lam:
            for name, p in self.params:
                if penalised(name):
                    value = value + 0.5 * self.lam * p.detach().double().pow(2).sum()
                    p.grad.add_(p.detach(), alpha=self.lam)  # type: ignore[union-attr]
        self.evaluations += 1
        return value.float()

    def step(self) -> tuple[float, bool]:
        """One L-BFGS iteration: the objective where it started (``LBFGS.step`` evaluates it
        there first), and whether it had converged: a relative change under ``TOLERANCE`` since
        the previous iteration's start."""
        self.model.train()
        value = float(self.optimizer.step(self.objective))  # type: ignore[arg-type]
        converged = abs(self.last - value) <= TOLERANCE * max(1.0, abs(value))
        self.last = value
        return value, converged

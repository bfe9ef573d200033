"""How a model's tasks share the layers above its features: one top MLP and a logit per task
(``shared``, a shared bottom), or experts with a gate and a tower per task: MMoE (Ma et al.,
"Modeling Task Relationships in Multi-task Learning with Multi-gate Mixture-of-Experts", KDD
2018) and PLE (Tang et al., "Progressive Layered Extraction", RecSys 2020).

Shapes: ``B`` batch, ``Z`` the input width (DLRM's interaction output), ``T`` tasks, ``E_s``
shared experts, ``E_t`` experts of each task, ``d`` an expert's output width.

    level l, task t:  in_t -> softmax(G_t in_t) . [experts_t(in_t), shared(in_s)]      [B, d]
    level l, shared:  in_s -> softmax(G_s in_s) . [experts_1..T(in_1..T), shared(in_s)] [B, d]
    logit_t = tower_t(out_t)                                                             [B]

MMoE is one level without task experts: every task's gate mixes the shared experts of ``z``.
Plain ``nn.Module`` code: no Ray, no ``torch.distributed``.
"""

import torch
from torch import nn

from recsys.config import ExpertsConfig, ModelConfig
from recsys.models.mlp import MLP


def task_layers(model: ModelConfig, in_features: int, num_tasks: int) -> nn.Module:
    """``[B, Z] -> [B, T]``: DLRM's top MLP and a logit per task (``model.tasks: shared``; no
    top MLP: the logits of ``z`` itself), or the experts of ``mmoe`` / ``ple``."""
    if model.tasks == "shared":
        top: nn.Module = nn.Identity()
        if model.top_mlp:
            top = MLP(in_features, model.top_mlp, model.norm, model.dropout)
        width = model.top_mlp[-1] if model.top_mlp else in_features
        return nn.Sequential(top, nn.Linear(width, num_tasks))
    return Experts(model.experts, model.tasks, in_features, num_tasks, model.norm, model.dropout)


class Level(nn.Module):
    """One extraction level: shared experts, each task's own experts, a gate per task (and,
    unless ``last``, a shared gate over every expert of the level).

    Args:
        in_features: the width of every input (``Z`` at the first level, ``d`` after).
        shared / own: shared experts, and experts of each task (0: MMoE).
        widths: an expert's layer widths; ``d = widths[-1]``.
        tasks: ``T``.
        last: the last level has no shared gate (only the tasks' outputs go on).
    """

    def __init__(
        self,
        in_features: int,
        shared: int,
        own: int,
        widths: list[int],
        tasks: int,
        last: bool,
        norm: str = "none",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()

        def experts(n: int) -> nn.ModuleList:
            return nn.ModuleList(MLP(in_features, widths, norm, dropout) for _ in range(n))

        self.shared = experts(shared)
        self.task_experts = nn.ModuleList(experts(own) for _ in range(tasks))
        self.gates = nn.ModuleList(nn.Linear(in_features, own + shared) for _ in range(tasks))
        self.shared_gate = None if last else nn.Linear(in_features, tasks * own + shared)

    def forward(self, inputs: list[torch.Tensor], shared_in: torch.Tensor) -> list[torch.Tensor]:
        """``inputs``: ``T x [B, in]`` (one per task), ``shared_in``: ``[B, in]`` -> ``T``
        outputs ``[B, d]``, and the shared output last unless this is the last level."""
        shared = [e(shared_in) for e in self.shared]  # E_s x [B, d]
        own: list[list[torch.Tensor]] = []
        for t, x in enumerate(inputs):
            experts = self.task_experts[t]
            assert isinstance(experts, nn.ModuleList)
            own.append([e(x) for e in experts])  # E_t x [B, d]
        outs = []
        for t, gate in enumerate(self.gates):
            outs.append(mix(gate(inputs[t]), [*own[t], *shared]))  # task t's mixture
        if self.shared_gate is not None:
            every = [e for task in own for e in task] + shared
            outs.append(mix(self.shared_gate(shared_in), every))
        return outs


def mix(scores: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    """``softmax(scores) [B, E]`` weighing ``E x [B, d]`` experts -> ``[B, d]``."""
    weights = torch.softmax(scores, dim=1)
    return (weights.unsqueeze(2) * torch.stack(experts, dim=1)).sum(1)


class Experts(nn.Module):
    """MMoE or PLE over ``z: [B, Z]`` -> logits ``[B, T]`` (a tower per task).

    Args:
        cfg: ``model.experts``.
        kind: ``mmoe`` (one level of ``cfg.count`` shared experts) or ``ple`` (``cfg.levels``
            levels of ``cfg.count`` shared and ``cfg.task_count`` own experts per task).
        in_features: ``Z``.
        num_tasks: ``T``.
        norm / dropout: ``model.norm`` and ``model.dropout``, in the experts and the towers.
    """

    def __init__(
        self,
        cfg: ExpertsConfig,
        kind: str,
        in_features: int,
        num_tasks: int,
        norm: str = "none",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        levels, own = (1, 0) if kind == "mmoe" else (cfg.levels, cfg.task_count)
        d = cfg.mlp[-1]
        self.levels = nn.ModuleList(
            Level(
                in_features if k == 0 else d,
                cfg.count,
                own,
                cfg.mlp,
                num_tasks,
                last=k == levels - 1,
                norm=norm,
                dropout=dropout,
            )
            for k in range(levels)
        )
        self.towers = nn.ModuleList(
            nn.Sequential(MLP(d, cfg.tower, norm, dropout), nn.Linear(cfg.tower[-1], 1))
            for _ in range(num_tasks)
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``z: [B, Z]`` -> ``[B, T]``."""
        tasks = len(self.towers)
        inputs, shared = [z for _ in range(tasks)], z
        for level in self.levels:
            outs = level(inputs, shared)
            inputs, shared = outs[:tasks], (outs[tasks] if len(outs) > tasks else shared)
        return torch.cat([tower(x) for tower, x in zip(self.towers, inputs, strict=True)], dim=1)

"""Every named experiment builds (tables on meta, nothing allocated); the DLRM LR policy."""

from __future__ import annotations

import pytest
import torch

from recsys.config import OptimConfig
from recsys.config_registry import EXPERIMENTS, named
from recsys.models import DLRM, embedding_report
from recsys.train.optim import LRPolicy, lr_factor


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_named_experiment_builds_on_meta(name):
    cfg = named(name)
    model = DLRM(cfg.model, cfg.embeddings, len(cfg.loss.tasks), embedding_device="meta")
    tables = {n: p for n, p in model.named_parameters() if "embedding_bag_collection" in n}
    assert tables and all(p.is_meta for p in tables.values())  # no table memory allocated
    assert sum(p.numel() for p in tables.values()) == embedding_report(cfg.embeddings).params
    dense = [p for n, p in model.named_parameters() if n not in tables]
    assert dense and not any(p.is_meta for p in dense)


def test_terabyte_tables_are_its_40m_row_tables():
    cfg = named("criteo_terabyte")
    assert max(cfg.embeddings.num_embeddings) == 40_000_000 and cfg.embeddings.dim == 128
    assert embedding_report(cfg.embeddings).bytes > 80 * 2**30  # why it can only be built on meta


CFG = OptimConfig(
    warmup_steps=4, decay_start_step=10, decay_steps=5, decay_power=2.0, end_lr_factor=0.1
)


def test_lr_factor_warmup_plateau_decay_and_after():
    factors = [lr_factor(step, CFG) for step in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]  # linear warmup to the peak
    assert factors[4:10] == [1.0] * 6  # plateau until decay_start_step
    for step in range(10, 15):  # polynomial decay to end_lr_factor over decay_steps
        done = (step - 10) / 5
        assert factors[step] == pytest.approx(0.1 + 0.9 * (1 - done) ** 2)
    assert factors[15:] == [pytest.approx(0.1)] * 5  # after the decay: end_lr_factor
    assert [lr_factor(s, OptimConfig()) for s in (0, 100, 10**6)] == [1.0, 1.0, 1.0]


def test_lr_policy_sets_every_param_group():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.2}, {"params": [b], "lr": 0.02}], lr=0.1)
    policy = LRPolicy(opt, CFG)
    assert policy.apply(1) == 0.5
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.01])
    policy.apply(30)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.02, 0.002])

"""GAUC on the workers (``recsys.train.evaluation.evaluate`` with the data's ``group_by``): a
prepared folder keeps each row's group (``groups.npy``), each rank scores its own rows, the rows
travel to the rank that owns their group, and 2 gloo ranks report the GAUC one rank does, equal to
``recsys.metrics.ranking.gauc`` (checked against pandas and scikit-learn in
``tests/unit/test_ranking_metrics.py``) on the model's logits; a monitor of GAUC over data
without groups is refused."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.config import ExperimentConfig
from recsys.data.dataset import resolve
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """Two periods of the drift log (users as groups), prepared in this process."""
    from recsys.data.schema import DatasetSchema
    from recsys.demo import drift
    from recsys.prepare.pipeline import prepare

    tmp = tmp_path_factory.mktemp("grouped")
    raw = str(tmp / "raw")
    drift.write(raw, 0, drift.Shape(users=300, items_per_period=60, rows_per_period=3000),
                range(2))  # fmt: skip
    out = str(tmp / "prepared")
    prepare(DatasetSchema.from_dict(drift.schema_dict()), [raw], out, workers=0,
            log=lambda s: None)  # fmt: skip
    return out


def config(folder: str) -> ExperimentConfig:
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}}))
    return cfg.with_overrides({"train.batch_size": 128, "train.seed": 3,
                               "model.sequence.pooling": "sum"})  # fmt: skip


def score_rank(rank, world, folder):
    """The validation metrics of one seeded, unsharded model on ``world`` ranks, and (rank 0)
    its logits over the whole split."""
    import torch

    from recsys.data.input.loader import eval_batches, load_splits
    from recsys.distributed.env import current
    from recsys.models import ModelAndLoss, build_model
    from recsys.train.evaluation import evaluate

    cfg = config(folder)
    torch.manual_seed(0)
    model = ModelAndLoss(build_model(cfg.model, cfg.embeddings, 1), cfg.loss)
    val = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).val
    metrics = evaluate(model, val, cfg, current(use_gpu=False), "val")
    logits = []
    if rank == 0:
        with torch.no_grad():
            for batch, mask in eval_batches(val, rank=0, world_size=1, batch_size=128,
                                            layout=cfg.embeddings.layout()):  # fmt: skip
                logits.append(model.eval()(batch)[1]["logits"][mask, 0])
    return {
        "metrics": metrics,
        "logits": torch.cat(logits).numpy() if logits else None,
        "groups": val.groups(0, len(val)),
        "labels": val.read(0, len(val)).labels[:, 0],
    }


def test_two_ranks_report_the_gauc_of_one(grouped):
    from recsys.metrics.ranking import gauc

    (one,) = run_ranks(score_rank, grouped, world_size=1, timeout=300)
    two = run_ranks(score_rank, grouped, world_size=2, timeout=300)
    assert two[0]["metrics"] == two[1]["metrics"]
    for key in ("val_gauc", "val_gauc_left_out", "val_auc"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-9), key
    want, left = gauc(one["groups"], one["labels"], one["logits"])
    assert one["metrics"]["val_gauc"] == pytest.approx(want, abs=1e-9)
    assert one["metrics"]["val_gauc_left_out"] == pytest.approx(left, abs=1e-12)
    assert 0 < left < 1 and len(np.unique(one["groups"])) > 50  # users, some with one class
    assert not (one["groups"] == 0).any()  # every row has its user


def test_a_gauc_monitor_needs_groups(grouped):
    from recsys.configlib import ConfigError
    from recsys.data.dataset import check_carried

    cfg = config(grouped)
    assert cfg.data.group_by == "user"
    check_carried(cfg.with_overrides({"train.monitor": "val_gauc"}))
    with pytest.raises(ConfigError, match="GAUC needs groups"):
        check_carried(ExperimentConfig().with_overrides({"train.monitor": "val_gauc"}))

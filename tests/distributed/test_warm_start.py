"""A new run started from another run's checkpoint (``train.init_from``, what ``recsys-retrain``
does): on 2 gloo ranks, its tables, dense weights and optimizer state are the saved run's; where
a table grew (a grown vocabulary), its saved rows are copied into its first rows and its new rows
keep their initial values; the new run's step, data position and scores start afresh. A model
whose tables are not the saved ones is refused, naming what the checkpoint holds instead."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import tiny_config
from tests.distributed.harness import run_ranks

pytestmark = pytest.mark.distributed

ROWS = [40, 60, 80, 900, 4000]
GROWN = [40, 60, 96, 900, 4000]  # t_cat_2 gained 16 rows
TABLE = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_2.weight"


def full_tables(model) -> dict[str, torch.Tensor]:
    """Every table and dense weight of a DMP, whole (a sharded table gathered)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for k, v in model.state_dict().items():
        if isinstance(v, ShardedTensor):
            full = torch.zeros(v.size()) if torch.distributed.get_rank() == 0 else None
            v.gather(dst=0, out=full)
            out[k] = full
        else:
            out[k] = v.detach().clone()
    return out


def warm_rank(rank, world, root):
    from recsys.distributed.checkpoint import CheckpointError
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    env = current(use_gpu=False)
    first = Trainer(tiny_config(**{"train.steps": 6}), env, LocalReporter(f"{root}/a", rank),
                    log=lambda s: None)  # fmt: skip
    first.train()
    saved = full_tables(first.stepper.model)
    folder = first.reporter.completed()[-1]
    grown = tiny_config(**{"train.steps": 6, "embeddings.num_embeddings": GROWN,
                           "train.init_from": folder})  # fmt: skip
    second = Trainer(grown, env, LocalReporter(f"{root}/b", rank), log=lambda s: None)  # warm
    started = full_tables(second.stepper.model)
    fresh = Trainer(tiny_config(**{"train.steps": 6, "embeddings.num_embeddings": GROWN}), env,
                    LocalReporter(f"{root}/c", rank), log=lambda s: None)  # fmt: skip
    initial = full_tables(fresh.stepper.model)
    note, step = second.resume_note, second.state.step
    metrics = second.train()
    qr = {"embeddings.qr.threshold": 70, "embeddings.qr.whole": ["cat_3"]}  # (cat_4 still split)
    split = tiny_config(**{"train.steps": 6, **qr, "train.init_from": folder})
    try:  # t_cat_2 (80 rows) QR-split now: not the saved model
        Trainer(split, env, LocalReporter(f"{root}/d", rank), log=lambda s: None)
        refused = ""
    except CheckpointError as e:
        refused = str(e)
    return {"saved": saved, "started": started, "initial": initial, "note": note, "step": step,
            "metrics": metrics, "refused": refused}  # fmt: skip


def test_a_warm_start_carries_the_saved_run_and_initialises_grown_rows(tmp_path):
    got = run_ranks(warm_rank, str(tmp_path))[0]  # rank 0 gathered every table
    saved, started, initial = got["saved"], got["started"], got["initial"]
    assert got["step"] == 0 and got["metrics"]["step"] == 6  # its own steps, afresh
    assert "t_cat_2: its saved rows copied, its new rows initialised" in got["note"]
    for key, value in saved.items():
        if key == TABLE:
            torch.testing.assert_close(started[key][:80], value, atol=0, rtol=0)
            torch.testing.assert_close(started[key][80:], initial[key][80:], atol=0, rtol=0)
        else:
            torch.testing.assert_close(started[key], value, atol=0, rtol=0)
    other = TABLE.replace("t_cat_2", "t_cat_0")
    assert not torch.equal(started[other], initial[other])  # carried over, not initialised
    assert "t_cat_2_q.weight: it was saved by another model (it has " in got["refused"]
    assert "embedding_bags.t_cat_2.weight" in got["refused"]  # what the checkpoint holds instead
    assert "t_cat_3" not in got["refused"]  # kept whole by qr.whole, as it was saved

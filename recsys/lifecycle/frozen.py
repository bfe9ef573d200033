"""The frozen champion on a later period: its checkpoint as it is, scored in this process on the
CPU (the whole model in memory: the scale of the tables a driver holds), every test row, through
its own tables. Where the new period's vocabulary grew (``--grow-vocab``), a new row's id is read
as the champion read that value: from the unseen row its hash picks (``frozen_ids``,
``MappedIds``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from recsys.config import ExperimentConfig
from recsys.data.columns import Columns, RowSource


def score_frozen(frozen: ExperimentConfig, checkpoint: str, period: ExperimentConfig
                 ) -> dict[str, float]:  # fmt: skip
    """``test_*`` of the champion (its config ``frozen``, its ``checkpoint``, local or in an
    object store) on the test rows of ``period`` (the configuration on the new period:
    ``recsys.lifecycle.plan.on_period``)."""
    import torch

    from recsys.data.input.loader import load_splits
    from recsys.distributed.checkpoint import load_model_unsharded
    from recsys.distributed.env import WorkerEnv
    from recsys.models import ModelAndLoss, build_model
    from recsys.runtime.storage import local_folder
    from recsys.train.evaluation import evaluate

    cfg = frozen.with_overrides({"data.paths": period.data.paths, "embeddings.dtype": "fp32",
                                 "data.group_by": period.data.group_by, "data.refit": False,
                                 "train.eval_batches": 0})  # fmt: skip
    wrapper = ModelAndLoss(build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks)), cfg.loss)
    with local_folder(checkpoint) as local:
        load_model_unsharded(local, wrapper)
    rows = cfg.embeddings.num_embeddings
    test = load_splits(period.data, cfg.model.num_dense, rows).test
    maps = frozen_ids(period.data.paths[0], rows)
    env = WorkerEnv(0, 1, 0, 1, torch.device("cpu"))
    return evaluate(wrapper.eval(), MappedIds(test, maps) if maps else test, cfg, env, "test")


def frozen_ids(folder: str, rows: list[int]) -> dict[int, np.ndarray]:
    """Per feature whose table in ``folder`` grew past the champion's ``rows``: each row id of
    the grown table mapped to the champion's (an earlier row to itself, a new row to the unseen
    row its value's hash picks: ``Vocabulary.ids``)."""
    from recsys.prepare.like import load_fitted

    fitted = load_fitted(folder)
    maps = {}
    for f, name in enumerate(fitted.schema.sparse):
        v = fitted.vocabs.get(name)
        if v is None or v.rows <= rows[f]:
            continue
        m = np.arange(v.rows, dtype=np.int64)
        new = np.arange(rows[f], v.rows)
        oov = np.uint64(v.oov_buckets)
        m[new] = (1 + v.hashes[new - 1 - v.oov_buckets] % oov).astype(np.int64)
        maps[f] = m
    return maps


class MappedIds(RowSource):
    """``base``'s rows with feature ``f``'s ids replaced by ``maps[f][id]``."""

    def __init__(self, base: RowSource, maps: dict[int, np.ndarray]) -> None:
        self.base, self.maps, self.source = base, maps, base.source

    def __len__(self) -> int:
        return len(self.base)

    def read(self, start: int, stop: int) -> Any:
        return self._mapped(self.base.read(start, stop))

    def take(self, idx: np.ndarray) -> Any:
        return self._mapped(self.base.take(idx))

    def groups(self, start: int, stop: int) -> np.ndarray | None:
        return self.base.groups(start, stop)

    def _mapped(self, cols: Any) -> Any:
        if isinstance(cols, Columns):
            sparse = np.array(cols.sparse)
            for f, m in self.maps.items():
                sparse[:, f, :] = m[sparse[:, f, :]]
            return dataclasses.replace(cols, sparse=sparse)
        values = tuple(self.maps[f][v].astype(v.dtype) if f in self.maps else v
                       for f, v in enumerate(cols.values))  # fmt: skip
        return dataclasses.replace(cols, values=values)

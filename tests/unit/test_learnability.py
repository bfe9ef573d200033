"""The synthetic data has a learnable signal: a tiny DLRM beats 0.5 AUC clearly; with shuffled
labels it stays near 0.5 (so a bug that breaks learning is visible as AUC near 0.5)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from recsys.config import DataConfig, EmbeddingConfig, LossConfig, ModelConfig, SyntheticConfig
from recsys.data.columns import Columns, RowSource
from recsys.data.input.loader import TrainStream, eval_batches, load_splits
from recsys.metrics.binary import binary_metrics
from recsys.models import DLRM, ModelAndLoss

ROWS = [200, 1000, 50, 5000, 300, 2000, 100, 800]
EMB = EmbeddingConfig(num_embeddings=ROWS, dim=8)
MODEL = ModelConfig(num_dense=13, bottom_mlp=[16], top_mlp=[16])


def train_and_eval(train: RowSource, val: RowSource, steps: int = 300) -> float:
    torch.manual_seed(0)
    model = ModelAndLoss(DLRM(MODEL, EMB), LossConfig())
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    kw = {"layout": EMB.layout()}
    stream = TrainStream(train, rank=0, world_size=1, batch_size=128, seed=0, shuffle=True, **kw)
    for _ in range(steps):
        loss, _ = model(next(stream))
        opt.zero_grad()
        loss.backward()
        opt.step()
    logits, labels = [], []
    with torch.no_grad():
        for batch, valid in eval_batches(val, rank=0, world_size=1, batch_size=512, **kw):
            _, out = model(batch)
            logits.append(out["logits"][valid, 0])
            labels.append(out["labels"][valid, 0])
    return binary_metrics(torch.cat(labels).numpy(), torch.cat(logits).numpy())["auc"]


def test_tiny_dlrm_learns_and_shuffled_labels_do_not():
    cfg = DataConfig(synthetic=SyntheticConfig(num_samples=30_000, seed=1))
    splits = load_splits(cfg, 13, ROWS)
    learned = train_and_eval(splits.train, splits.val)
    train = splits.train.resident()
    assert isinstance(train, Columns)  # synthetic rows, generated into memory
    shuffled_labels = np.random.default_rng(0).permutation(train.labels)
    shuffled = train_and_eval(dataclasses.replace(train, labels=shuffled_labels), splits.val)
    print(f"val AUC: learned {learned:.3f}, shuffled labels {shuffled:.3f}")
    assert learned > 0.70
    assert abs(shuffled - 0.5) < 0.05

"""Sequence pooling on the planted history log (``recsys.demo.histories``: the click
depends on the categories of the user's last 8 items against the candidate's; the true click
probability known).

The same DLRM (the shipped ``clicklogs`` space's base and budget for one task, as
``benchmarks.experts`` and ``benchmarks.quality``) is
trained with ``model.sequence.pooling: sum | attention | transformer`` by the product's trainer
over the same seeds; its best checkpoint scores the prepared test rows. Two independent
plain-PyTorch models written here (``PlainHistory``: the user, the candidate and the pooled
history concatenated, an MLP; the history summed, or pooled by a DIN attention unit of its own)
check the product's on the same split, and the oracle bounds all.

Goal: attention pooling beats sum pooling of the same history by at least 0.01 test AUC, the
seeds' paired differences' whole 95% interval (``benchmarks.goals.pooling_gain``: a mean above
0.01 whose interval crosses it is not met).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks import independent as ind
from benchmarks.common import init_world1, table
from benchmarks.experts import FIXED, base_config, difference, train_one
from benchmarks.goals import POOLING_GAIN, Interval, independent_confirms, pooling_gain, shown
from benchmarks.logs import own_space

KINDS = ("sum", "attention", "transformer")


def prepare_log(tmp: str, rows: int) -> tuple[str, Any]:
    """The planted history log of ``rows`` rows prepared (80/10/10 by order): its folder and
    its raw test rows (with ``p_click``)."""
    from recsys.data.schema import DatasetSchema
    from recsys.demo import histories, planted
    from recsys.prepare.pipeline import prepare

    path = histories.write(os.path.join(tmp, "histories_raw"), rows)
    out = os.path.join(tmp, "histories")
    schema = DatasetSchema.from_dict(histories.schema_dict())
    meta = prepare(schema, [os.path.dirname(path)], out, workers=0, log=lambda s: None)
    return out, planted.test_rows(path, meta)


class PlainHistory(nn.Module):
    """``[user, candidate, pooled history]`` embeddings (the candidate and the history share the
    item table), then ``Linear -> ReLU`` layers and a logit. The history (the prepared ids,
    oldest first, at most ``max_len``) is padded to ``[B, max_len]``; ``din``: each item scored
    by ``Linear(4d, 36) -> PReLU -> Linear(36, 1)`` of ``[e, t, e - t, e * t]``, the scores
    masked and not normalised; else summed."""

    def __init__(self, users: int, items: int, dim: int, max_len: int, din: bool) -> None:
        super().__init__()
        self.user, self.item, self.max_len = (
            nn.Embedding(users, dim),
            nn.Embedding(items, dim),
            max_len,
        )
        for table_ in (self.user, self.item):
            nn.init.normal_(table_.weight, std=0.05)
        self.din = (
            nn.Sequential(nn.Linear(4 * dim, 36), nn.PReLU(36), nn.Linear(36, 1)) if din else None
        )
        self.mlp = nn.Sequential(nn.Linear(3 * dim, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                 nn.Linear(32, 1))  # fmt: skip

    def history(
        self, ids: torch.Tensor, offsets: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, L]`` item ids (newest first, 0 where none) and their mask."""
        lengths = torch.diff(offsets, append=torch.tensor([len(ids)]))
        pos = torch.arange(self.max_len)
        mask = pos[None, :] < lengths[:, None]
        ends = offsets + lengths
        index = (ends[:, None] - 1 - pos[None, :]).clamp(min=0, max=max(len(ids) - 1, 0))
        padded = ids[index] if len(ids) else torch.zeros(n, self.max_len, dtype=torch.long)
        return torch.where(mask, padded, 0), mask

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]
                ) -> torch.Tensor:  # fmt: skip
        n = len(offsets[0])
        u, t = self.user(ids[0]), self.item(ids[1])
        hist, mask = self.history(ids[2], offsets[2], n)
        e = self.item(hist) * mask[..., None]  # [B, L, d]
        if self.din is None:
            pooled = e.sum(1)
        else:
            tt = t[:, None].expand_as(e)
            pairs = torch.cat([e, tt, e - tt, e * tt], 2)  # [B, L, 4d]
            a = self.din(pairs.flatten(0, 1)).view(mask.shape) * mask  # (PReLU: channels 2nd)
            pooled = (a[..., None] * e).sum(1)
        return self.mlp(torch.cat([u, t, pooled], 1))


def plain(data: dict[str, Any], base: Any, din: bool, seed: int) -> ind.Fitted:
    rows = base.embeddings.num_embeddings
    max_len = base.embeddings.sequences["history"]
    name = "plain DIN" if din else "plain sum"
    return ind.train_plain(name, lambda: PlainHistory(rows[0], rows[1], 16, max_len, din), data,
                           lr=3e-3, max_epochs=30, patience=3, seed=seed)  # fmt: skip


def run(rows: int, seeds: list[int], epochs: float) -> str:
    from recsys.demo import planted

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    init_world1()
    t0 = time.perf_counter()
    runs: dict[str, list[float]] = {k: [] for k in KINDS}
    vals: dict[str, list[float]] = {k: [] for k in KINDS}
    plains: dict[str, list[ind.Fitted]] = {"plain sum": [], "plain DIN": []}
    with tempfile.TemporaryDirectory() as tmp:
        prepared, test = prepare_log(tmp, rows)
        base = base_config(prepared, epochs, own_space(os.path.join(tmp, "space.yaml"), True))
        data = ind.arrays(base, [0])
        for seed in seeds:
            for kind in KINDS:
                cfg = base.with_overrides({"model.sequence.pooling": kind, "train.seed": seed})
                val, aucs, step = train_one(cfg, os.path.join(tmp, f"{kind}_{seed}"))
                runs[kind].append(aucs[0])
                vals[kind].append(val)
                print(f"seed {seed} {kind}: val {val:.4f}, test {aucs[0]:.4f} (step {step})",
                      flush=True)  # fmt: skip
            for din in (False, True):
                fitted = plain(data, base, din, seed)
                plains[fitted.name].append(fitted)
                print(f"seed {seed} {fitted.name}: test {fitted.test_auc[0]:.4f}", flush=True)
    oracle = planted.oracle_auc(test)
    body = [[f"DLRM, `model.sequence.pooling: {k}`", f"{np.mean(vals[k]):.4f}",
             f"{np.mean(runs[k]):.4f}", ", ".join(f"{a:.4f}" for a in runs[k])]
            for k in KINDS]  # fmt: skip
    for name, fits in plains.items():
        body.append([f"{name} (independent)", f"{np.mean([f.val_auc[0] for f in fits]):.4f}",
                     f"{np.mean([f.test_auc[0] for f in fits]):.4f}",
                     ", ".join(f"{f.test_auc[0]:.4f}" for f in fits)])  # fmt: skip
    body.append(["oracle (true p_click)", "-", f"{oracle:.4f}", "Bayes-optimal"])
    goals = []
    for kind in ("attention", "transformer"):
        diffs = [a - b for a, b in zip(runs[kind], runs["sum"], strict=True)]
        goals.append([f"{kind} beats sum pooling by >= {POOLING_GAIN} test AUC",
                      difference(diffs), pooling_gain(Interval.of(diffs))])  # fmt: skip
    diffs = [a.test_auc[0] - b.test_auc[0]
             for a, b in zip(plains["plain DIN"], plains["plain sum"], strict=True)]  # fmt: skip
    mean = float(np.mean(diffs))
    goals.append(["independent check: plain DIN against plain sum",
                  shown(mean, independent_confirms), independent_confirms(mean)])  # fmt: skip
    n = {k: len(v) for k, v in data.items()}
    head = (
        f"Planted history log: {n['train']:,} training, {n['val']:,} validation, "
        f"{n['test']:,} test rows (the last 8 history items by time count); DLRM "
        f"({', '.join(f'{k}={v}' for k, v in FIXED.items())}, the `clicklogs` space's base, "
        f"{epochs:g} epochs with its patience), seeds {seeds}; "
        f"{(time.perf_counter() - t0) / 60:.1f} min in all.\n\n"
    )
    header = ["model", "best val AUC", "test AUC (mean)", "per seed"]
    return head + table(header, body) + "\n\n" + table(["goal", "figure", "verdict"], goals)

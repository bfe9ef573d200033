"""Binary-classification metrics of CTR models over a split that no rank holds.

``MetricState``: the metrics of ``recsys.metrics.binary`` (``binary_metrics``) and the expected
calibration error (``recsys.metrics.ranking.ece``), each rank adding its rows' sufficient statistics
(sums for log loss, NE, calibration and accuracy; per probability bin, the predicted and observed
sums; per-class histograms of the logits), the states are summed over ranks once (one all-reduce on
the device), and every rank computes the split's figures from the sum. A rank's cost is its own rows
plus a ``2 x 2^bits`` histogram, whatever the number of ranks; ``bits`` grows with the rows
evaluated (``bits_for``: from 16 for a few hundred rows to 22, 64 MB, for millions), the same on
every rank.

AUC from the histograms: the logits' float32 bits are mapped to an order-preserving integer whose
top ``bits`` bits are the bin (bin width: ``2^-(bits - 9)`` relative: 6e-5 at 22 bits), so bins
are ordered as scores; pairs in different bins are counted exactly and pairs in the same bin as
one half. The true AUC differs by at most ``sum_b pos_b * neg_b / (2 P N)``, which is reported as
``auc_error_bound`` (0 when no bin holds both classes).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from recsys.metrics.binary import EPS, entropy
from recsys.metrics.ranking import ECE_BINS, group_aucs

MIN_BITS, MAX_BITS = 16, 22
# sums per task: count, positives, predicted probability, log loss, correct at 0.5
_COUNT, _POS, _PROB, _LOGLOSS, _CORRECT = range(5)


def bits_for(rows: int) -> int:
    """Histogram bits for evaluating ``rows`` rows: about 64 bins a row, within [16, 22]."""
    return int(min(MAX_BITS, max(MIN_BITS, math.ceil(math.log2(max(rows, 1))) + 6)))


def score_bins(logits: torch.Tensor, bits: int = MAX_BITS) -> torch.Tensor:
    """Bin of each float32 logit: the top ``bits`` bits of an integer ordered as the floats."""
    x = logits.float() + 0.0  # -0.0 + 0.0 == +0.0: one bin for both zeros (they tie)
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    ordered = torch.where(u >= 1 << 31, (~u) & 0xFFFFFFFF, u | (1 << 31))
    return ordered >> (32 - bits)


class MetricState:
    """Sufficient statistics of the binary metrics of ``tasks`` heads, on ``device``, with a
    ``2^bits``-bin histogram per class (every rank of one evaluation must use the same bits).

    ``update`` adds a batch, ``tensors`` are what to sum over ranks, ``compute`` gives the
    figures of everything added (on every rank after the sum)."""

    def __init__(self, tasks: int, device: torch.device, bits: int = MAX_BITS) -> None:
        self.bits = bits
        self.hist = torch.zeros(tasks, 2, 1 << bits, dtype=torch.int64, device=device)
        self.sums = torch.zeros(tasks, 5, dtype=torch.float64, device=device)
        # per task and probability bin: the predicted probabilities' sum and the labels'
        self.calib = torch.zeros(tasks, 2, ECE_BINS, dtype=torch.float64, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.hist, self.sums, self.calib]

    def update(self, logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> None:
        """``logits``, ``labels``: ``[B, T]``; ``valid``: ``[B]`` bool (padding rows False).
        Padding rows weigh 0 rather than being indexed out: a boolean index counts its rows on
        the host, which waits for the device at every batch."""
        keep = valid.unsqueeze(1)  # [B, 1]
        w = keep.double()
        x = torch.where(keep, logits, 0.0)  # (a padding row's logit need not be finite)
        y = torch.where(keep, labels.double(), 0.0)
        p = torch.sigmoid(x.double()).clamp(EPS, 1 - EPS)
        ll = -(y * torch.log(p) + (1 - y) * torch.log(1 - p))
        correct = ((p > 0.5) == (y > 0.5)).double()
        sums = torch.stack(
            [w.expand_as(y).sum(0), y.sum(0), (p * w).sum(0), (ll * w).sum(0),
             (correct * w).sum(0)], 1
        )  # fmt: skip
        self.sums += sums
        which = (p * ECE_BINS).long().clamp(max=ECE_BINS - 1)  # [B, T]
        for t in range(self.calib.shape[0]):
            self.calib[t, 0].index_add_(0, which[:, t], p[:, t] * w[:, 0])
            self.calib[t, 1].index_add_(0, which[:, t], y[:, t])
        bins = score_bins(x, self.bits)  # [B, T]
        for t in range(self.hist.shape[0]):
            cls = (y[:, t] > 0.5).long()
            self.hist[t].index_put_((cls, bins[:, t]), valid.long(), accumulate=True)

    def compute(self, t: int = 0) -> dict[str, float]:
        """The metrics of head ``t`` (as ``binary_metrics``) and ``auc_error_bound``."""
        count, pos, prob, ll, correct = (float(v) for v in self.sums[t].cpu())
        ctr = pos / count if count else float("nan")
        log_loss_ = ll / count if count else float("nan")
        auc_, bound = _hist_auc(self.hist[t, 0], self.hist[t, 1])
        return {
            "auc": auc_,
            "auc_error_bound": bound,
            "log_loss": log_loss_,
            "ne": log_loss_ / entropy(ctr) if count else float("nan"),
            "calibration": (prob / count) / ctr if ctr > 0 else float("nan"),
            "ece": float((self.calib[t, 0] - self.calib[t, 1]).abs().sum()) / count
            if count
            else float("nan"),
            "accuracy": correct / count if count else float("nan"),
            "ctr": ctr,
            "count": count,
        }


def _hist_auc(neg: torch.Tensor, pos: torch.Tensor) -> tuple[float, float]:
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan"), float("nan")
    below = torch.cumsum(neg, 0) - neg  # negatives in lower bins
    pairs = n_pos * n_neg
    won = (pos.double() * below.double()).sum() + 0.5 * (pos.double() * neg.double()).sum()
    tied = (pos.double() * neg.double()).sum()
    return float(won / pairs), float(tied / (2 * pairs))


class GroupAUC:
    """The group AUC (``recsys.metrics.ranking.gauc``) of ``tasks`` heads over a split whose
    rows no rank holds alone: each rank keeps its rows' groups, logits and labels (``[n]``
    int64, ``[n, T]``, ``[n, T]``: its own rows only), ``finish`` sends every row to the rank
    that owns its group (``group mod world``: one all-to-all, ``collectives.exchange``), each
    rank computes its groups' AUCs exactly, and the sums to add over ranks are, per task: the
    rows of the groups with both classes times their AUC, those rows, and the rows left out
    (groups with one class, and rows without a group, 0)."""

    def __init__(self, tasks: int, device: torch.device) -> None:
        self.device = device
        self.sums = torch.zeros(tasks, 3, dtype=torch.float64, device=device)
        self.held: list[tuple[torch.Tensor, ...]] = []  # groups, logits, labels, valid

    def tensors(self) -> list[torch.Tensor]:
        return [self.sums]

    def update(
        self, groups: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor
    ) -> None:
        """``groups``: ``[B]`` int64, ``logits`` and ``labels``: ``[B, T]``, ``valid``: ``[B]``.
        Held on the device as they are; ``finish`` drops the padding rows and moves them once
        (each batch's copy to the host would wait for the device)."""
        self.held.append((groups.to(self.device, non_blocking=True), logits.detach().float(),
                          labels.float(), valid.to(self.device, non_blocking=True)))  # fmt: skip

    def finish(self, world_size: int) -> None:
        """Exchange the rows by group and add this rank's groups to the sums (every rank must
        call it: a collective)."""
        from recsys.distributed import collectives

        tasks = self.sums.shape[0]
        held = self.held or [(torch.zeros(0, dtype=torch.int64), torch.zeros(0, tasks),
                              torch.zeros(0, tasks), torch.zeros(0, dtype=torch.bool))]  # fmt: skip
        keep = torch.cat([h[3] for h in held])
        g, x, y = (torch.cat([h[i] for h in held])[keep].cpu() for i in range(3))
        self.held = []
        g, x, y = collectives.exchange([g, x, y], torch.remainder(g, world_size), self.device)
        grouped = g != 0
        for t in range(tasks):
            size, aucs = group_aucs(g[grouped].numpy(), y[grouped, t].numpy(),
                                    x[grouped, t].numpy())  # fmt: skip
            kept = ~np.isnan(aucs)
            left = float(size[~kept].sum()) + float((~grouped).sum())
            add = [float((size[kept] * aucs[kept]).sum()), float(size[kept].sum()), left]
            self.sums[t] += torch.tensor(add, dtype=torch.float64, device=self.device)

    def compute(self, t: int = 0) -> dict[str, float]:
        """``gauc`` and ``gauc_left_out`` (the share of rows in groups with one class, or in
        no group)."""
        weighted, kept, left = (float(v) for v in self.sums[t].cpu())
        return {
            "gauc": weighted / kept if kept else float("nan"),
            "gauc_left_out": left / (kept + left) if kept + left else float("nan"),
        }

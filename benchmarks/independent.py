"""Models written independently of the product, trained on the same prepared split: what the
quality benchmark and the reference tests hold the product's models against.

- ``sklearn_lr``: scikit-learn's ``LogisticRegression`` on one-hot (bag-of-ids) features and the
  prepared dense features, ``C`` tuned on the validation split, per task;
- ``PlainFM``: a factorization machine in plain PyTorch (``nn.EmbeddingBag`` per field for the
  factors and the linear weights, learned dense factors), Adam, early stopping;
- ``PlainMLP``: the per-field embeddings concatenated with the dense features, an MLP with batch
  norm and dropout, Adam, early stopping.

Nothing here uses TorchRec, FBGEMM, the product's loader or its trainer: the split's rows are
read once (``arrays``), ids taken modulo their table's rows as the product does.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from recsys.config import ExperimentConfig
from recsys.data.input.loader import load_splits
from recsys.metrics.binary import auc


@dataclass
class Rows:
    """One split as arrays: ``dense [N, I]``, per field its ids (mod rows) and offsets in
    ``EmbeddingBag``'s layout (``ids[f][offsets[f][n]:offsets[f][n + 1]]`` are row ``n``'s),
    ``labels [N, T]``."""

    dense: np.ndarray
    ids: list[np.ndarray]
    offsets: list[np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def one_hot(self) -> bool:
        return all(len(i) == len(self) for i in self.ids)

    def take(self, idx: np.ndarray) -> Rows:
        ids, offsets = [], []
        for v, o in zip(self.ids, self.offsets, strict=True):
            starts, lengths = o[idx], o[idx + 1] - o[idx]
            ends = np.cumsum(lengths)
            pos = np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts - ends + lengths,
                                                                             lengths)  # fmt: skip
            ids.append(v[pos])
            offsets.append(np.concatenate([[0], ends]))
        return Rows(self.dense[idx], ids, offsets, self.labels[idx])


def arrays(cfg: ExperimentConfig, task_columns: list[int]) -> dict[str, Rows]:
    """The train, val and test splits of ``cfg``'s data as ``Rows`` (labels: ``task_columns``)."""
    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    rows = cfg.embeddings.num_embeddings
    out = {}
    for name in ("train", "val", "test"):
        src = getattr(splits, name)
        cols = src.read(0, len(src))
        lengths = np.asarray(cols.lengths, np.int64)
        ids, offsets = [], []
        for f, values in enumerate(cols.values):
            ids.append(np.asarray(values, np.int64) % rows[f])
            offsets.append(np.concatenate([[0], np.cumsum(lengths[:, f])]))
        labels = np.asarray(cols.labels, np.float32)[:, task_columns]
        out[name] = Rows(np.asarray(cols.dense, np.float32), ids, offsets, labels)
    return out


# --- scikit-learn ------------------------------------------------------------------------------


def design(rows: Rows, table_rows: list[int], poolings: list[str]) -> Any:
    """The one-hot (bag-of-ids; ``mean`` pooling: each id ``1 / len``) matrix beside the dense
    columns: scipy CSR ``[N, sum(table_rows) + I]``."""
    from scipy import sparse

    n, base, blocks = len(rows), 0, []
    for v, o, r, pool in zip(rows.ids, rows.offsets, table_rows, poolings, strict=True):
        lengths = np.diff(o)
        weight = np.ones(len(v)) if pool == "sum" else np.repeat(1 / np.maximum(lengths, 1),
                                                                  lengths)  # fmt: skip
        blocks.append(sparse.csr_matrix((weight, v, o), shape=(n, r)))
        base += r
    if rows.dense.shape[1]:
        blocks.append(sparse.csr_matrix(rows.dense))
    return sparse.hstack(blocks, format="csr")


@dataclass
class Fitted:
    """An independent model's result: its best validation and test AUC per task, the setting
    chosen, where it peaked (``peak``: epochs, or the chosen ``C``), the validation curve, and
    the test scores (logits, ``[N, T]``)."""

    name: str
    val_auc: list[float]
    test_auc: list[float]
    chosen: str
    peak: float = math.nan
    epochs: float = math.nan
    curve: list[float] = field(default_factory=list)
    seconds: float = 0.0
    test_logits: np.ndarray | None = None

    @property
    def overfits(self) -> bool:
        """Its validation AUC fell after its peak (by more than 0.002) before it stopped."""
        return bool(self.curve) and max(self.curve) - self.curve[-1] > 0.002

    def mean(self, which: str = "test") -> float:
        return float(np.mean(self.test_auc if which == "test" else self.val_auc))


def sklearn_lr(
    data: dict[str, Rows], table_rows: list[int], poolings: list[str],
    cs: tuple[float, ...] = (1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
) -> Fitted:  # fmt: skip
    """``LogisticRegression`` (L2, lbfgs) per task, ``C`` chosen by validation AUC over
    ``cs`` (decades of L2 strength: a rare-id log peaks at a strong one)."""
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    x = {k: design(v, table_rows, poolings) for k, v in data.items()}
    vals: list[float] = []
    tests: list[float] = []
    chosen: list[float] = []
    logits: list[Any] = []
    for t in range(data["train"].labels.shape[1]):
        best = (-1.0, math.nan, 0.0, None)
        for c in cs:
            model = LogisticRegression(C=c, max_iter=2000).fit(
                x["train"], data["train"].labels[:, t]
            )
            v = auc(data["val"].labels[:, t], model.decision_function(x["val"]))
            if v > best[0]:
                test = model.decision_function(x["test"])
                best = (v, auc(data["test"].labels[:, t], test), c, test)
        vals.append(best[0])
        tests.append(best[1])
        chosen.append(best[2])
        logits.append(best[3])
    return Fitted("scikit-learn LR", vals, tests, f"C={chosen}" if len(chosen) > 1 else
                  f"C={chosen[0]}", seconds=time.perf_counter() - t0,
                  test_logits=np.stack(logits, 1))  # fmt: skip


# --- plain PyTorch -----------------------------------------------------------------------------


class Fields(nn.Module):
    """One ``nn.EmbeddingBag`` per field, pooled as the field is."""

    def __init__(self, table_rows: list[int], poolings: list[str], dim: int, std: float) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, dim, mode=p) for r, p in
                                  zip(table_rows, poolings, strict=True))  # fmt: skip
        for b in self.bags:
            assert isinstance(b, nn.EmbeddingBag)
            nn.init.normal_(b.weight, 0.0, std)

    def forward(self, ids: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        """-> ``[B, F, dim]``."""
        return torch.stack([b(i, o) for b, i, o in zip(self.bags, ids, offsets, strict=True)], 1)


class PlainFM(nn.Module):
    """``b_t + <w_t, dense> + sum_f w_t(ids_f) + sum_{i<j} <v_i, v_j>`` over the dense and
    sparse fields (a dense field's factor: its value times a learned vector)."""

    def __init__(self, table_rows: list[int], poolings: list[str], num_dense: int, dim: int,
                 tasks: int) -> None:  # fmt: skip
        super().__init__()
        self.factors = Fields(table_rows, poolings, dim, 0.01)
        self.linear = Fields(table_rows, poolings, tasks, 0.0)
        self.dense = nn.Linear(num_dense, tasks) if num_dense else None
        self.bias = nn.Parameter(torch.zeros(tasks))
        self.dense_factors = nn.Parameter(torch.randn(num_dense, dim) * 0.01)

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]
                ) -> torch.Tensor:  # fmt: skip
        v = self.factors(ids, offsets)
        if self.dense is not None:
            v = torch.cat([dense.unsqueeze(2) * self.dense_factors, v], 1)
        total = v.sum(1)
        pairs = 0.5 * (total * total - (v * v).sum(1)).sum(1, keepdim=True)
        out = self.bias + self.linear(ids, offsets).sum(1) + pairs
        return out + self.dense(dense) if self.dense is not None else out


class PlainMLP(nn.Module):
    """The fields' embeddings concatenated with the dense features, then ``Linear -> BatchNorm
    -> ReLU -> Dropout`` per hidden layer, then a ``Linear`` to the tasks' logits."""

    def __init__(self, table_rows: list[int], poolings: list[str], num_dense: int, dim: int,
                 hidden: tuple[int, ...], dropout: float, tasks: int) -> None:  # fmt: skip
        super().__init__()
        self.fields = Fields(table_rows, poolings, dim, 0.05)
        layers: list[nn.Module] = []
        width = dim * len(table_rows) + num_dense
        for h in hidden:
            layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        self.net = nn.Sequential(*layers, nn.Linear(width, tasks))

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]
                ) -> torch.Tensor:  # fmt: skip
        return self.net(torch.cat([self.fields(ids, offsets).flatten(1), dense], 1))


def tensors(rows: Rows) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """``rows`` as the plain models' input (offsets without their last entry)."""
    return (torch.from_numpy(rows.dense), [torch.from_numpy(i) for i in rows.ids],
            [torch.from_numpy(o[:-1]) for o in rows.offsets])  # fmt: skip


def scores(model: nn.Module, rows: Rows, batch: int = 8192) -> np.ndarray:
    """``[N, T]`` logits in evaluation mode."""
    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), batch):
            out.append(model(*tensors(rows.take(np.arange(s, min(s + batch, len(rows)))))))
    model.train()
    return torch.cat(out).numpy()


def aucs(labels: np.ndarray, logits: np.ndarray) -> list[float]:
    return [auc(labels[:, t], logits[:, t]) for t in range(labels.shape[1])]


def train_plain(
    name: str,
    make: Callable[[], nn.Module],
    data: dict[str, Rows],
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    batch: int = 512,
    max_epochs: int = 30,
    patience: int = 2,
    evals_per_epoch: int = 2,
    seed: int = 0,
) -> Fitted:
    """Adam on the mean BCE over the tasks, shuffled batches, validation ``evals_per_epoch``
    times an epoch (the mean AUC over the tasks), stopped after ``patience`` evaluations without
    a new best; the best state is kept and scores the test split."""
    torch.manual_seed(seed)
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    train, rng = data["train"], np.random.default_rng(seed)
    n = len(train)
    per_epoch = math.ceil(n / batch)
    every = max(1, per_epoch // evals_per_epoch)
    best, best_state, best_at, bad, curve, step = -1.0, None, 0.0, 0, [], 0
    t0 = time.perf_counter()
    for _ in range(max_epochs):
        order = rng.permutation(n)
        for s in range(0, n, batch):
            b = train.take(order[s : s + batch])
            if len(b) < 2:  # (batch norm needs two rows)
                continue
            logits = model(*tensors(b))
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(b.labels)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % every and s + batch < n:
                continue
            value = float(np.mean(aucs(data["val"].labels, scores(model, data["val"]))))
            curve.append(value)
            if value > best:
                best, best_state, best_at, bad = value, copy.deepcopy(model.state_dict()), step, 0
            else:
                bad += 1
            if bad >= patience:
                break
        if bad >= patience:
            break
    assert best_state is not None
    model.load_state_dict(best_state)
    val, test = scores(model, data["val"]), scores(model, data["test"])
    return Fitted(
        name, aucs(data["val"].labels, val), aucs(data["test"].labels, test),
        f"lr={lr:g}, weight_decay={weight_decay:g}, batch={batch}", peak=best_at / per_epoch,
        epochs=step / per_epoch, curve=curve, seconds=time.perf_counter() - t0, test_logits=test,
    )  # fmt: skip


def plain_fm(data: dict[str, Rows], cfg: ExperimentConfig, dim: int, **kw: Any) -> Fitted:
    rows, pools = cfg.embeddings.num_embeddings, poolings(cfg)
    tasks = data["train"].labels.shape[1]
    return train_plain(
        "plain FM", lambda: PlainFM(rows, pools, cfg.model.num_dense, dim, tasks), data, **kw
    )


def plain_mlp(
    data: dict[str, Rows], cfg: ExperimentConfig, dim: int = 16,
    hidden: tuple[int, ...] = (256, 128), dropout: float = 0.2, **kw: Any,
) -> Fitted:  # fmt: skip
    rows, pools = cfg.embeddings.num_embeddings, poolings(cfg)
    tasks = data["train"].labels.shape[1]
    return train_plain(
        "plain MLP",
        lambda: PlainMLP(rows, pools, cfg.model.num_dense, dim, hidden, dropout, tasks),
        data,
        **kw,
    )


def poolings(cfg: ExperimentConfig) -> list[str]:
    return [cfg.embeddings.pooling_of(f) for f in cfg.embeddings.names()]

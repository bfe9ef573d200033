"""Embedding tables: one TorchRec ``EmbeddingBagCollection`` holding every table, QR and mixed dims.

A table may be read by several features (``EmbeddingConfig.shared``: a user's ``history`` of item
ids reads ``item_id``'s table): it is one TorchRec table, named after its owner, whose
``feature_names`` list every reader, so the collection, the sharding planner, checkpoints and the
quantized export all see one table and its gradient sums the readers' lookups.

QR embeddings (Shi et al., KDD 2020) are built from ordinary TorchRec tables: a feature ``f`` whose
table is QR-split reads its quotient table under key ``f`` (ids ``i // c``) and its remainder table
under key ``f__qr_r`` (ids ``i % c``), so both tables live in the same collection and
``DistributedModelParallel`` shards them like any other table.

Where the ids are split: the input of ``SparseArch`` is the split KJT (``SparseLayout.keys()``),
built on the host with the batch (``recsys.data.input.loader.to_batch``). Splitting inside the model
would make the collection's input a computed value, and TorchRec's train pipeline then leaves it
out ("will NOT be pipelined, due to input modifications"): no input-distribution overlap for any
table, and a device sync for ``length_per_key`` twice a step. Where raw ids arrive instead
(export, serving), ``recsys.models.dlrm.WithRawIds`` splits them in front of the model with
``qr_split_kjt`` (scriptable), which gives the same KJT.

Pooling subtlety (facebookresearch/dlrm issue 366): the two lookups are each pooled, then combined.
For ``add`` and ``concat`` this equals pooling the per-id combined vectors (both are linear). For
``mult`` with multi-hot bags it gives ``(sum_j q_j) * (sum_j r_j)`` rather than
``sum_j (q_j * r_j)``; for one-hot features (Criteo) the two are identical. We combine after pooling
because it keeps the lookups fused pooled TBE kernels; ``tests/unit/test_embeddings.py`` pins this.

Weighted lists (``EmbeddingConfig.weighted``): the collection is built weighted
(``is_weighted=True``) and reads each id's weight from the KJT (``weights()``: a weighted
feature's own, 1 for the others' ids, a QR remainder's its quotient's), pooling a bag to
``sum_j w_j * E[id_j]``. TorchRec's flag is the collection's, not the input's: an unweighted
collection given a weighted KJT ignores the weights without a word, so the flag is set from the
config wherever the tables are built (training, sharding, the quantized export all copy it).

Shapes: ``B`` batch size, ``F`` sparse features, ``D`` common dim, ``d_f`` the dim of feature f.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import QR_SUFFIX, EmbeddingConfig, SequenceConfig
from recsys.models.sequence import make_pooling

_DTYPES = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
_POOLING = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}


@dataclass(frozen=True)
class TableSpec:
    """One TorchRec table: its name, the KJT keys it reads (its owner's first, then those of the
    features that share it: ``EmbeddingConfig.shared``; a sequence's position keys), rows and
    dim."""

    name: str
    features: tuple[str, ...]
    rows: int
    dim: int
    role: str  # "full", "quotient" or "remainder"

    @property
    def owner(self) -> str:
        """The feature the table is named after (its other readers share it)."""
        suffix = {"full": "", "quotient": "_q", "remainder": "_r"}[self.role]
        return self.name.removeprefix("t_").removesuffix(suffix)


INIT_CHUNK_ROWS = 1 << 16  # rows filled at a time (bounds the index tensors' memory)
_MASK = (1 << 63) - 1


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 (wrapping arithmetic), kept non-negative."""
    x = x ^ ((x >> 30) & 0x3FFFFFFFF)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9 as int64
    x = x ^ ((x >> 27) & 0x1FFFFFFFFF)
    x = x * -7723592293110705685  # 0x94D049BB133111EB as int64
    x = x ^ ((x >> 31) & 0x1FFFFFFFF)
    return x & _MASK


def table_seed(seed: int, table: str) -> int:
    """A table's own init seed: the run's seed and the table's name (stable across processes)."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(table.encode())) & 0x7FFFFFFF


@dataclass(frozen=True)
class TableInit:
    """How one table starts: ``U(low, high)``, or ``N(mean, std^2)`` with ``std`` set; ``seed``
    its own (``table_seed``). Every value depends only on ``(seed, global row, global column)``
    (``fill``), so a shard gets the values of its place in the table whatever the plan."""

    seed: int
    low: float
    high: float
    std: float | None = None
    mean: float = 0.0

    def fill(self, out: torch.Tensor, row0: int, col0: int, cols: int) -> torch.Tensor:
        """Fill ``out`` (rows ``row0..``, columns ``col0..`` of a table ``cols`` wide) in place.

        A counter-based generator (SplitMix64 of the element's index), filled ``INIT_CHUNK_ROWS``
        rows at a time; a normal value is Box-Muller's of two such uniforms."""
        rows, width = out.shape
        col_idx = torch.arange(col0, col0 + width, dtype=torch.int64, device=out.device)
        with torch.no_grad():
            for lo in range(0, rows, INIT_CHUNK_ROWS):
                hi = min(rows, lo + INIT_CHUNK_ROWS)
                r = torch.arange(row0 + lo, row0 + hi, dtype=torch.int64, device=out.device)
                index = r[:, None] * cols + col_idx[None, :]
                out[lo:hi].copy_(self._values(index).to(out.dtype))
        return out

    def _values(self, index: torch.Tensor) -> torch.Tensor:
        u = _uniform(index, self.seed)
        if self.std is None:
            return self.low + (self.high - self.low) * u
        v = _uniform(index, self.seed ^ 0x5DEECE66D)
        radius = torch.sqrt(-2.0 * torch.log1p(-u))  # 1 - u in (0, 1]: never log(0)
        return self.mean + self.std * radius * torch.cos(2.0 * math.pi * v)


def _uniform(index: torch.Tensor, seed: int) -> torch.Tensor:
    """A ``U[0, 1)`` float64 per element index, from ``seed`` (SplitMix64)."""
    bits = _mix(index + seed * 0x9E3779B97F4A7C15 % (1 << 62))
    return (bits >> 11).to(torch.float64) * (1.0 / (1 << 52))


def _table_init(weight: torch.Tensor, init: TableInit) -> torch.Tensor:
    """A whole table's init (``EmbeddingBagConfig.init_fn``); shards of row- or column-wise
    sharded tables are refilled from their offsets after sharding
    (``recsys.distributed.sharding.init_tables``), and so is what TorchRec hands a rank that
    holds no part of the table (not a plain 2-d tensor)."""
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.dim() != 2:
        return weight
    return init.fill(weight, 0, 0, weight.shape[1])


def table_specs(cfg: EmbeddingConfig) -> list[TableSpec]:
    """The tables a config builds, QR applied: one per feature that owns its table, read by it
    and by the features sharing it (``EmbeddingConfig.shared``), in feature order; two for a
    QR-split one (every reader's ids split alike: a sharer has its owner's rows)."""
    specs: list[TableSpec] = []
    names, layout = cfg.names(), cfg.layout()
    for name, rows, dim in zip(names, cfg.num_embeddings, cfg.table_dims(), strict=True):
        if name in cfg.shared:
            continue
        features = (name, *(f for f in names if cfg.shared.get(f) == name))
        readers = tuple(k for f in features for k in layout.feature_keys(f))
        if not cfg.qr_split(name):
            specs.append(TableSpec(f"t_{name}", readers, rows, dim, "full"))
            continue
        c = cfg.qr.collisions
        dq, dr = (dim - dim // 2, dim // 2) if cfg.qr.operation == "concat" else (dim, dim)
        remainders = tuple(f + QR_SUFFIX for f in readers)
        specs.append(TableSpec(f"t_{name}_q", readers, math.ceil(rows / c), dq, "quotient"))
        specs.append(TableSpec(f"t_{name}_r", remainders, c, dr, "remainder"))
    return specs


def _init_of(spec: TableSpec, cfg: EmbeddingConfig, seed: int) -> TableInit:
    """A table's init: ``U(-sqrt(1/rows), sqrt(1/rows))``, or ``N(0, init_std^2)``; a ``mult``
    remainder starts near 1 (``U(0.9, 1.1)``, or ``N(1, init_std^2)``) so ``q * r`` starts near
    ``q``."""
    tseed, std = table_seed(seed, spec.name), cfg.init_std
    if spec.role == "remainder" and cfg.qr.operation == "mult":
        return TableInit(tseed, 0.9, 1.1, std, mean=1.0)
    bound = math.sqrt(1.0 / spec.rows)
    return TableInit(tseed, -bound, bound, std)


def table_inits(cfg: EmbeddingConfig, seed: int) -> dict[str, TableInit]:
    """Per table name: how it starts (``TableInit``), from the run's ``seed``."""
    return {spec.name: _init_of(spec, cfg, seed) for spec in table_specs(cfg)}


def embedding_bag_configs(cfg: EmbeddingConfig, seed: int = 0) -> list[EmbeddingBagConfig]:
    """TorchRec table configs (dtype, pooling and init set where the tables are defined; each
    table's init is its own, from ``seed`` and its name)."""
    out = []
    inits = table_inits(cfg, seed)
    for spec in table_specs(cfg):
        out.append(
            EmbeddingBagConfig(
                name=spec.name,
                embedding_dim=spec.dim,
                num_embeddings=spec.rows,
                feature_names=list(spec.features),
                pooling=_POOLING[cfg.pooling_of(spec.owner)],
                data_type=_DTYPES[cfg.dtype],
                init_fn=functools.partial(_table_init, init=inits[spec.name]),
            )
        )
    return out


def qr_split_kjt(kjt: KeyedJaggedTensor, collisions: dict[str, int]) -> KeyedJaggedTensor:
    """Split the ids of QR features into quotient (key ``f``) and remainder (key ``f__qr_r``).

    Args:
        kjt: sparse features, keys ``[f_1..f_F]``, weighted or not.
        collisions: ``{feature: c}`` for each QR-split feature.

    Returns:
        A KJT with the same keys in the same order (QR features now holding ``id // c``) followed by
        one ``f__qr_r`` key per QR feature holding ``id % c``, with the same lengths; a weighted
        ``kjt`` gives a weighted one, each remainder id weighted as its quotient (as the data
        path's ``recsys.data.input.loader.ragged_kjt``).

    Written for TorchScript too (the exported model scripts it).
    """
    if len(collisions) == 0:
        return kjt
    keys: list[str] = kjt.keys()
    stride = kjt.stride()
    per_key = kjt.length_per_key()
    values = kjt.values().split(per_key)
    lengths = kjt.lengths().view(len(keys), stride)
    weights = kjt.weights_or_none()
    new_values: list[torch.Tensor] = []
    extra_values: list[torch.Tensor] = []
    extra_weights: list[torch.Tensor] = []
    extra_lengths: list[torch.Tensor] = [kjt.lengths()]
    extra_keys: list[str] = []
    key_weights: list[torch.Tensor] = []
    if weights is not None:
        key_weights = list(weights.split(per_key))
    for i in range(len(keys)):
        key = keys[i]
        if key in collisions:
            c = collisions[key]
            new_values.append(torch.div(values[i], c, rounding_mode="floor"))
            extra_values.append(torch.remainder(values[i], c))
            extra_lengths.append(lengths[i])
            extra_keys.append(key + "__qr_r")  # QR_SUFFIX (TorchScript takes no str globals)
            if weights is not None:
                extra_weights.append(key_weights[i])  # a remainder weighs as its quotient
        else:
            new_values.append(values[i])
    new_weights: torch.Tensor | None = None
    if weights is not None:
        new_weights = torch.cat(key_weights + extra_weights)
    return KeyedJaggedTensor(
        keys=keys + extra_keys,
        values=torch.cat(new_values + extra_values),
        weights=new_weights,
        lengths=torch.cat(extra_lengths),
        stride=stride,
    )


def combine_qr(q: torch.Tensor, r: torch.Tensor, operation: str) -> torch.Tensor:
    """Combine pooled quotient and remainder lookups, ``[B, d_q]`` and ``[B, d_r]``."""
    if operation == "mult":
        return q * r
    if operation == "add":
        return q + r
    return torch.cat([q, r], dim=1)


class SparseArch(nn.Module):
    """Looks up and pools every sparse feature; returns one ``[B, d_f]`` tensor per feature.

    Features that share a table (``EmbeddingConfig.shared``) look their ids up in the same rows,
    each pooled on its own (TorchRec pools every feature of a table separately); QR and the
    projection to ``project_to`` are per feature, as for any other. With ``cfg.weighted`` the
    collection is weighted: a bag pools to ``sum_j w_j * E[id_j]`` (the KJT's weights; 1 for the
    ids of unweighted features). A sequence (``cfg.sequences``) is looked up position by
    position (each position key a bag of at most one id), its ``L`` lookups stacked to
    ``[B, L, d_f]`` with the positions a row has (the position keys' lengths), and pooled by
    ``recsys.models.sequence`` against its target's lookup.

    Args:
        cfg: the embedding tables.
        project_to: if set, features whose dim differs are projected (no bias) to this dim, so the
            interaction sees ``F`` tensors of ``[B, project_to]``.
        device: where the ``EmbeddingBagCollection`` is created; ``meta`` to shard it later.
        init_seed: seeds each table's init (with its name; ``TableInit``).
        sequence: how sequences are pooled (``model.sequence``); None: summed (the references).
        dropout: the transformer pooling's dropout (``model.dropout``).

    Example::

        arch = SparseArch(EmbeddingConfig(num_embeddings=[10, 20], dim=8))
        pooled = arch(kjt)          # [tensor[B, 8], tensor[B, 8]]; kjt with the layout's keys
    """

    def __init__(
        self,
        cfg: EmbeddingConfig,
        project_to: int | None = None,
        device: torch.device | str | None = None,
        init_seed: int = 0,
        sequence: SequenceConfig | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        layout = cfg.layout()
        self.features = cfg.names()
        self.keys = {f: layout.feature_keys(f) for f in self.features}
        self.operation = cfg.qr.operation
        self.collisions = layout.split()  # (the data path's rule: one map)
        self.weighted = bool(cfg.weighted)
        self.embedding_bag_collection = EmbeddingBagCollection(
            tables=embedding_bag_configs(cfg, init_seed),
            is_weighted=self.weighted,
            device=torch.device(device or "cpu"),
        )
        dims = cfg.table_dims()
        self.out_dims = [project_to or d for d in dims]
        self.projections = nn.ModuleDict(
            {
                f: nn.Linear(d, project_to, bias=False)
                for f, d in zip(self.features, dims, strict=True)
                if project_to is not None and d != project_to
            }
        )
        ids = layout.id_keys()  # a sequence's position keys are consecutive: its first's index
        self.sequences = {f: (ids.index(self.keys[f][0]), n) for f, n in cfg.sequences.items()}
        self.targets = dict(cfg.sequence_targets)
        width = dict(zip(self.features, self.out_dims, strict=True))
        self.poolings = nn.ModuleDict({
            f: make_pooling(sequence, width[f], n, dropout) for f, n in cfg.sequences.items()
        })  # fmt: skip

    def lookup(self, pooled: dict[str, torch.Tensor], key: str, feature: str) -> torch.Tensor:
        """One key's ``[B, d_f]`` lookup: its QR parts combined, in FP32, projected."""
        emb = pooled[key]
        if key in self.collisions:
            emb = combine_qr(emb, pooled[key + QR_SUFFIX], self.operation)
        emb = emb.float()
        if feature in self.projections:
            emb = self.projections[feature](emb)
        return emb

    def forward(self, features: KeyedJaggedTensor) -> list[torch.Tensor]:
        """``features``: the split KJT (``EmbeddingConfig.layout().keys()``; weighted when
        ``cfg.weighted`` names a feature) -> F x ``[B, d_f]``."""
        pooled = self.embedding_bag_collection(features).to_dict()
        out = {f: self.lookup(pooled, f, f) for f in self.features if f not in self.sequences}
        lengths = features.lengths().view(-1, features.stride())  # [keys, B], the layout's order
        for f, (first, length) in self.sequences.items():
            items = torch.stack([self.lookup(pooled, k, f) for k in self.keys[f]], dim=1)
            mask = lengths[first : first + length].t() > 0  # [B, L]: the positions a row has
            target = out[self.targets[f]] if f in self.targets else items[:, 0]  # (sum: unused)
            out[f] = self.poolings[f](items, mask, target)
        return [out[f] for f in self.features]

"""Reference models a sweep's winner is compared with: logistic regression and a factorization
machine, built from the same TorchRec tables as DLRM (one per feature, or one for the features that
share it: ``embeddings.shared``; QR as configured), so they are sharded, trained, checkpointed and
exported by the same code. A shared table holds one weight (and one factor) per id for every
feature that reads it: a user's ``history`` of items weighs an item as ``item_id`` does.

Published CTR benchmarks (BARS / FuxiCTR, arXiv 2009.05794) found tuned deep models close to these
on small data; a sweep that lists them as ``baselines`` shows by how much its best DLRM beats them.

FBGEMM needs table widths in multiples of 4, so an id's weight for task ``t`` is the sum of its
row's columns ``4t..4t+3`` (``LINEAR_WIDTH``): a linear model all the same (the four columns get
equal gradients, so it is one weight learning at four times the table's learning rate).

Neither has an MLP, so ``model.dropout`` and ``model.norm`` do not apply to them (ignored, as
DLRM's other fields); their regularisation is weight decay: ``optim.embedding_weight_decay`` on
tables that FBGEMM's fused optimizer trains (as DLRM's) and ``optim.weight_decay`` on the dense
terms, and on the tables too where they train dense (a sweep's references over small tables:
``recsys.tune.space``).

Without dense features (``model.num_dense == 0``) both have no dense terms: LR's dense linear
layer is a bias alone (``bias``), FM has no dense factors. The ``[B, 0]`` dense input is ignored.

Shapes: ``B`` batch, ``I`` dense features, ``F`` sparse features, ``D`` factor dim, ``T`` tasks.
Plain ``nn.Module`` code, as ``recsys.models.dlrm``.
"""

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.archs import LINEAR_WIDTH
from recsys.config import EmbeddingConfig, ModelConfig, model_tables
from recsys.models.embeddings import SparseArch


def linear_terms(rows: torch.Tensor, num_tasks: int) -> torch.Tensor:
    """``rows: [B, F, LINEAR_WIDTH * T]`` pooled linear columns -> ``[B, T]``: each task's sum over
    the features and its four columns."""
    return rows.sum(1).reshape(-1, num_tasks, LINEAR_WIDTH).sum(-1)


class LogisticRegression(nn.Module):
    """``logit_t = b_t + <w_t, dense> + sum_f w_t(id_f)``; ``b_t + sum_f w_t(id_f)`` without dense
    features (``b`` is then ``bias``, zeros at init; else ``dense_linear``'s).

    Args: as ``DLRM`` (``model.num_dense``; the tables' rows, QR and dtype from ``embeddings``).

    Example::

        model = LogisticRegression(ModelConfig(arch="lr", num_dense=13), EmbeddingConfig(...))
        logits = model(dense, kjt)  # dense: [B, 13] -> logits: [B, 1]
    """

    def __init__(
        self,
        model: ModelConfig,
        embeddings: EmbeddingConfig,
        num_tasks: int = 1,
        embedding_device: torch.device | str | None = None,
        init_seed: int = 0,
    ) -> None:
        super().__init__()
        self.num_tasks = num_tasks
        tables = model_tables(model, embeddings, num_tasks)
        self.sparse_arch = SparseArch(tables, device=embedding_device, init_seed=init_seed)
        self.has_dense = model.num_dense > 0
        if self.has_dense:
            self.dense_linear = nn.Linear(model.num_dense, num_tasks)
        else:  # no [T, 0] weight: a zero-element parameter is no use to DDP or a checkpoint
            self.bias = nn.Parameter(torch.zeros(num_tasks))

    def first_order(self, dense: torch.Tensor) -> torch.Tensor:
        """The bias and dense linear terms: ``dense: [B, I]`` -> ``[B, T]``; without dense
        features the bias alone, ``[T]`` (``dense`` ignored)."""
        if not self.has_dense:
            return self.bias
        return self.dense_linear(dense)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """``dense: [B, I]`` (``I = 0``: ignored), ``sparse``: the layout's KJT -> logits
        ``[B, T]``."""
        rows = torch.stack(self.sparse_arch(sparse), dim=1)  # [B, F, 4T]
        return self.first_order(dense) + linear_terms(rows, self.num_tasks)


class FactorizationMachine(LogisticRegression):
    """Rendle's FM over the dense and sparse features: the LR terms plus
    ``sum_{i<j} <v_i, v_j>`` over the ``I + F`` fields, where a sparse field's factor ``v_f`` is
    its id's ``D`` factor columns and a dense field's is its value times a learned ``[D]`` vector.
    The second-order term is shared by the ``T`` tasks; each has its own linear terms and bias.
    Without dense features the pairs are over the ``F`` sparse fields alone.

    Args: as ``DLRM``; ``embeddings.dim`` is ``D`` (the tables are ``D + 4T`` wide:
    ``model_tables``).
    """

    def __init__(
        self,
        model: ModelConfig,
        embeddings: EmbeddingConfig,
        num_tasks: int = 1,
        embedding_device: torch.device | str | None = None,
        init_seed: int = 0,
    ) -> None:
        super().__init__(model, embeddings, num_tasks, embedding_device, init_seed)
        self.dim = embeddings.dim
        if self.has_dense:
            bound = (1.0 / model.num_dense) ** 0.5 / embeddings.dim
            self.dense_factors = nn.Parameter(
                torch.empty(model.num_dense, embeddings.dim).uniform_(-bound, bound)
            )

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """``dense: [B, I]`` (``I = 0``: ignored), ``sparse``: the layout's KJT -> logits
        ``[B, T]``."""
        rows = torch.stack(self.sparse_arch(sparse), dim=1)  # [B, F, D + 4T]
        factors = rows[:, :, : self.dim]  # [B, F, D]
        if self.has_dense:
            factors = torch.cat([dense.unsqueeze(2) * self.dense_factors, factors], dim=1)
        total = factors.sum(1)  # factors: [B, I + F, D]
        pairs = 0.5 * (total * total - (factors * factors).sum(1)).sum(1, keepdim=True)  # [B, 1]
        linear = linear_terms(rows[:, :, self.dim :], self.num_tasks)
        return self.first_order(dense) + linear + pairs

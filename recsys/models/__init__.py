"""DLRM and reference models over TorchRec types. Imports neither Ray nor ``torch.distributed``."""

from recsys.models.accounting import EmbeddingReport, embedding_report
from recsys.models.build import build_model
from recsys.models.dlrm import DLRM, WithRawIds, materialize
from recsys.models.loss import Loss, ModelAndLoss

__all__ = [
    "DLRM",
    "EmbeddingReport",
    "Loss",
    "ModelAndLoss",
    "WithRawIds",
    "build_model",
    "embedding_report",
    "materialize",
]

"""Typed, validated configs: one small dataclass per concern.

Each component receives only its own piece (the model never sees ``TrainConfig``). A whole
experiment round-trips through a plain dict, which is what Ray Tune hands a trial::

    cfg = ExperimentConfig.from_dict(trial_dict)   # once, at the top of the worker
    trial_dict == cfg.to_dict()

Search spaces address fields by dotted keys (``embeddings.qr.threshold``); see
``ExperimentConfig.all_keys()``.
"""

from recsys.config.choices import (
    CUDA_ONLY_SHARDING,
    INTERACTIONS,
    MEAN_TASK,
    MONITORED,
    QR_SUFFIX,
    SHARDING_TYPES,
    BadRowPolicy,
    ComputeKernel,
    DenseOptimizer,
    DenseTables,
    EmbeddingDecayMode,
    EmbeddingDType,
    EmbeddingOptimizer,
    Interaction,
    LossKind,
    MLPNorm,
    Mode,
    PipelineMode,
    Pooling,
    QROperation,
    SequencePooling,
    ShardingType,
    Solver,
    Source,
    SplitMode,
    TaskSharing,
    monitor_parts,
)
from recsys.config.data import DataConfig, SyntheticConfig
from recsys.config.embeddings import (
    POSITION,
    EmbeddingConfig,
    QRConfig,
    SparseLayout,
    md_dims,
    position_keys,
)
from recsys.config.experiment import MAP_KEYS, ExperimentConfig, is_map_key
from recsys.config.model import (
    ExpertsConfig,
    FinalMLPConfig,
    LossConfig,
    ModelConfig,
    SequenceConfig,
    TaskConfig,
    model_tables,
)
from recsys.config.train import (
    EMBEDDING_DECAY_MODES,
    OptimConfig,
    ShardingConfig,
    TableSharding,
    TrainConfig,
)
from recsys.configlib import ConfigError

__all__ = [
    "CUDA_ONLY_SHARDING",
    "EMBEDDING_DECAY_MODES",
    "INTERACTIONS",
    "MAP_KEYS",
    "MEAN_TASK",
    "MONITORED",
    "POSITION",
    "QR_SUFFIX",
    "SHARDING_TYPES",
    "BadRowPolicy",
    "ComputeKernel",
    "ConfigError",
    "DataConfig",
    "DenseOptimizer",
    "DenseTables",
    "EmbeddingConfig",
    "EmbeddingDType",
    "EmbeddingDecayMode",
    "EmbeddingOptimizer",
    "ExperimentConfig",
    "ExpertsConfig",
    "FinalMLPConfig",
    "Interaction",
    "LossConfig",
    "LossKind",
    "MLPNorm",
    "Mode",
    "ModelConfig",
    "OptimConfig",
    "PipelineMode",
    "Pooling",
    "QRConfig",
    "QROperation",
    "SequenceConfig",
    "SequencePooling",
    "ShardingConfig",
    "ShardingType",
    "Solver",
    "Source",
    "SparseLayout",
    "SplitMode",
    "SyntheticConfig",
    "TableSharding",
    "TaskConfig",
    "TaskSharing",
    "TrainConfig",
    "is_map_key",
    "md_dims",
    "model_tables",
    "monitor_parts",
    "position_keys",
]

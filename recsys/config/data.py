"""Where a run's rows come from: a generated log, a prepared folder, or TorchRec's Criteo
files; the batch and the split."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.choices import Source, SplitMode
from recsys.configlib import (
    check,
    check_choices,
)


@dataclass
class SyntheticConfig:
    """Synthetic click log with a planted logistic signal (see ``recsys.data.input.synthetic``).

    Attributes:
        num_samples: rows generated in total (before the train/val/test split).
        seed: the generator's seed; same seed, same data.
        positive_rate: target share of positive labels (Criteo: about 0.25).
        zipf_alpha: exponent of the power-law id frequencies.
        signal: strength of the planted signal (logit scale); 0 makes labels pure noise.
        multi_hot: ids per bag (1 = one-hot, as Criteo).
    """

    num_samples: int = 20_000
    seed: int = 0
    positive_rate: float = 0.25
    zipf_alpha: float = 1.1
    signal: float = 2.0
    multi_hot: int = 1

    def __post_init__(self) -> None:
        check(self.num_samples >= 1, "data.synthetic.num_samples", self.num_samples, ">= 1")
        check(0 < self.positive_rate < 1, "data.synthetic.positive_rate", self.positive_rate, "")
        check(self.zipf_alpha > 0, "data.synthetic.zipf_alpha", self.zipf_alpha, "must be > 0")
        check(self.multi_hot >= 1, "data.synthetic.multi_hot", self.multi_hot, "must be >= 1")


@dataclass
class DataConfig:
    """Where samples come from and how they are split.

    Attributes:
        source: ``synthetic`` (generated, ``synthetic``); ``prepared`` (a folder made by
            ``recsys-preprocess`` from click logs, Criteo's included: features, table sizes,
            poolings, dense count and tasks all come from its ``meta.json``
            (``recsys.data.dataset.resolve``), and so does the split); ``torchrec`` (a folder of
            TorchRec's own preprocessed Criteo, ``day_N_{dense,sparse,labels}.npy``).
        paths: the prepared folder (one; a local path, or an object store URI such as
            ``s3://bucket/prepared``), or TorchRec folders in time order.
        split: ``synthetic`` and ``torchrec`` only (a prepared folder is split already):
            ``fraction``: the rows in file order are cut into train / val / test by
            ``val_fraction`` and ``test_fraction``; ``files``: the last day is test, the one
            before it validation (Terabyte: day 23 test, day 22 validation).
        val_fraction / test_fraction: ``split: fraction``: the shares of the rows (the last
            ones, in file order) that are validation and test.
        shuffle: reshuffle each worker's training rows every epoch (seeded); off keeps time order.
        synthetic: generator options when ``source`` is ``synthetic``.
        prefetch: training batches made ahead of the step in a background thread (0: on the
            training thread); the data order and exact resume are the same either way.
        cache_dir: where a worker caches the shards it reads of a prepared folder in an object
            store (``recsys.data.prepared.remote``: only its own rows' shards, shared by the
            workers of a node, free space checked first); empty: ``recsys-data-cache`` in the
            system's temp folder.
        torchrec_dense_min: a folder made by TorchRec's own preprocessing stores dense features
            as ``log(x - min + 2)`` without recording ``min``; it is read off each day's first
            rows unless declared here (``recsys.data.prepared.torchrec_npy``).
        refit: train on the training and the validation rows together, the validation rows
            after the training rows (a chosen configuration trained again on all rows before the
            test period: ``recsys-export --refit``). Its validation metrics are then measured on
            rows it trained on; the test split is its only held-out score.
        group_by: the column that groups rows for ranking, as the prepared folder's schema
            names it (set from its ``meta.json``, like the features): every evaluation then
            also reports GAUC (``val_gauc``, ``val_gauc_left_out``), which a sweep or a retrain
            may then score by; None for other sources.
    """

    source: Source = "synthetic"
    paths: list[str] = field(default_factory=list)
    split: SplitMode = "fraction"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    shuffle: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    prefetch: int = 2
    cache_dir: str = ""
    torchrec_dense_min: int | None = None
    refit: bool = False
    group_by: str | None = None

    def __post_init__(self) -> None:
        check_choices(self, "data")
        check(self.prefetch >= 0, "data.prefetch", self.prefetch, "must be >= 0 (0: off)")
        if self.source != "synthetic":
            check(len(self.paths) > 0, "data.paths", self.paths, f"{self.source} needs paths")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            check(0 <= v < 1, f"data.{name}", v, "must be in [0, 1)")
        check(
            self.val_fraction + self.test_fraction < 1,
            "data.val_fraction + data.test_fraction",
            self.val_fraction + self.test_fraction,
            "leaves no training data",
        )

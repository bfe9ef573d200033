"""One training step, plainly or through TorchRec's ``TrainPipelineSparseDist``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from recsys.config import ShardingConfig


def use_pipeline(cfg: ShardingConfig, device: torch.device) -> bool:
    """``sharding.pipeline``: ``on``, ``off``, or ``auto`` (on GPU only)."""
    return cfg.pipeline == "on" or (cfg.pipeline == "auto" and device.type == "cuda")


class Stepper:
    """``stepper(batches) -> outputs`` runs one training step.

    With ``pipeline``, TorchRec's ``TrainPipelineSparseDist`` drives it: the next batch's copy to
    the device and its sparse input distribution overlap this batch's compute, so the pipeline
    holds up to two batches ahead of the step being trained.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, pipeline: bool):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.pipeline = TrainPipelineSparseDist(model, optimizer, device) if pipeline else None

    def __call__(self, batches: Iterator[Batch]) -> dict[str, torch.Tensor]:
        if self.pipeline is not None:
            return self.pipeline.progress(batches)
        batch = next(batches).to(self.device, non_blocking=True)
        self.optimizer.zero_grad()
        loss, out = self.model(batch)
        loss.backward()
        self.optimizer.step()
        return out

    @contextlib.contextmanager
    def plain_model(self) -> Iterator[nn.Module]:
        """The model with its original forward (the pipeline rewrites it); in-flight batches
        stay in the pipeline and training resumes where it was."""
        if self.pipeline is None:
            yield self.model
            return
        model = self.pipeline.detach()
        try:
            yield model
        finally:
            self.pipeline.attach(model)

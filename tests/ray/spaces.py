"""Tiny search spaces for the sweep tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

TINY = """
base: debug
num_samples: 2
overrides:
  embeddings.num_embeddings: [50, 200, 1000, 3000]
  embeddings.dim: 8
  model.bottom_mlp: [8]
  model.top_mlp: [8]
  data.synthetic.num_samples: 4000
  train.steps: {steps}
  train.batch_size: 64
  train.checkpoint_every: 10
  train.log_every: 5
space:
  embeddings.dtype: {{grid: [fp32, fp16]}}
  model.interaction: {{choice: [dot, cat]}}
  embeddings.qr.threshold: {{choice: [null, 500]}}
  loss.weights: {{choice: [[1.0, 1.0], [1.0, 2.0]]}}
  optim.lr: {{loguniform: [0.02, 0.1]}}
"""


def write_space(folder: Path, steps: int = 20, name: str = "tiny") -> str:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(TINY.format(steps=steps)))
    return str(path)

"""A multilayer perceptron with an optional normalisation and dropout in every layer.

Each layer is ``Linear -> norm -> ReLU -> dropout``: ``norm`` is ``none``, ``batch``
(``BatchNorm1d``) or ``layer`` (``LayerNorm``), ``dropout`` a probability (``0``: no dropout
module at all). TorchRec's ``MLP`` has neither, hence this module; with ``norm="none"`` and
``dropout=0`` it computes what TorchRec's ``MLP`` does (``relu(Linear(x))`` per layer) and draws
its initial weights in the same order (``nn.Linear``'s default initialisation, layer by layer).

Plain ``nn.Module`` code over torch only. Batch norm keeps running statistics per process; a
distributed trainer has to make them agree across its workers (``recsys.train.trainer``), never
this module.

Shapes: ``B`` batch, ``I`` input width, ``O`` the last layer's width.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

NORMS = ("none", "batch", "layer")


def norm_layer(norm: str, width: int) -> nn.Module | None:
    """The normalisation ``norm`` of ``width`` features (``None`` for ``none``)."""
    if norm == "batch":
        return nn.BatchNorm1d(width)
    if norm == "layer":
        return nn.LayerNorm(width)
    if norm == "none":
        return None
    raise ValueError(f"unknown norm {norm!r}; choose one of {NORMS}")


def mlp_layer(in_features: int, out_features: int, norm: str, dropout: float) -> nn.Sequential:
    """One layer, ``[B, in_features] -> [B, out_features]``: ``linear``, then ``norm`` (if
    any), ``act`` (ReLU), ``dropout`` (if ``dropout > 0``), as named submodules."""
    parts: OrderedDict[str, nn.Module] = OrderedDict(linear=nn.Linear(in_features, out_features))
    normalise = norm_layer(norm, out_features)
    if normalise is not None:
        parts["norm"] = normalise
    parts["act"] = nn.ReLU()
    if dropout > 0:
        parts["dropout"] = nn.Dropout(dropout)
    return nn.Sequential(parts)


class MLP(nn.Sequential):
    """``len(widths)`` layers ``Linear -> norm -> ReLU -> dropout``: ``mlp(x)``, ``x: [B, I]``
    -> ``[B, O]``, ``O = widths[-1]`` (``nn.Sequential``'s forward).

    Args:
        in_features: the input width ``I``.
        widths: each layer's output width (at least one).
        norm: ``none``, ``batch`` or ``layer``.
        dropout: the probability of zeroing an activation in training, in ``[0, 1)``.

    Example::

        mlp = MLP(13, [64, 16], norm="batch", dropout=0.1)
        out = mlp(torch.randn(32, 13))  # [32, 16]
        mlp[0].linear, mlp[0].norm      # the first layer's Linear(13, 64) and BatchNorm1d(64)
    """

    def __init__(
        self, in_features: int, widths: list[int], norm: str = "none", dropout: float = 0.0
    ) -> None:
        if not widths:
            raise ValueError("an MLP needs at least one layer width")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout={dropout!r}: a probability in [0, 1)")
        ins = [in_features, *widths[:-1]]
        super().__init__(
            *[mlp_layer(i, o, norm, dropout) for i, o in zip(ins, widths, strict=True)]
        )
        self.in_features = in_features
        self.out_features = widths[-1]

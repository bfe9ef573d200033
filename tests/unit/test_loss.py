"""Losses equal their formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recsys.config import ConfigError, LossConfig, TaskConfig
from recsys.models.loss import Loss


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 1, generator=g) * 3, torch.randint(0, 2, (16,), generator=g).float()


def test_wbce_equals_weighted_formula(data):
    logits, y = data
    loss, out = Loss(LossConfig(kind="wbce", weights=(0.5, 3.0)))(logits, y)
    p = torch.sigmoid(logits[:, 0])
    manual = -(3.0 * y * torch.log(p) + 0.5 * (1 - y) * torch.log(1 - p)).mean()
    torch.testing.assert_close(loss, manual)
    torch.testing.assert_close(out["weights"][:, 0], 0.5 + 2.5 * y)


def test_wbce_with_unit_weights_equals_bce(data):
    logits, y = data
    wbce, _ = Loss(LossConfig(kind="wbce", weights=(1.0, 1.0)))(logits, y)
    bce, _ = Loss(LossConfig(kind="bce"))(logits, y)
    torch.testing.assert_close(wbce, bce)
    torch.testing.assert_close(bce, F.binary_cross_entropy_with_logits(logits[:, 0], y))


def test_bce_is_stable_for_extreme_logits():
    loss, _ = Loss(LossConfig())(torch.tensor([[100.0], [-100.0]]), torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(loss, torch.tensor(100.0))


def test_mse_on_probabilities(data):
    logits, y = data
    loss, _ = Loss(LossConfig(kind="mse"))(logits, y)
    torch.testing.assert_close(loss, ((torch.sigmoid(logits[:, 0]) - y) ** 2).mean())


def test_multitask_is_weighted_sum(data):
    logits, _ = data
    logits2 = torch.cat([logits, -logits * 0.5], dim=1)
    labels = torch.randint(0, 2, (16, 3), generator=torch.Generator().manual_seed(1)).float()
    tasks = [TaskConfig("click", 0, 1.0), TaskConfig("buy", 2, 0.25)]
    loss, out = Loss(LossConfig(tasks=tasks))(logits2, labels)
    a = F.binary_cross_entropy_with_logits(logits2[:, 0], labels[:, 0])
    b = F.binary_cross_entropy_with_logits(logits2[:, 1], labels[:, 2])
    torch.testing.assert_close(loss, a + 0.25 * b)
    assert out["labels"].shape == (16, 2)


def test_missing_label_column_is_clear():
    with pytest.raises(ValueError, match=r"label columns \[0, 3\], data has 1"):
        Loss(LossConfig(tasks=[TaskConfig("a", 0), TaskConfig("b", 3)]))(
            torch.zeros(2, 2), torch.zeros(2)
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": (-1.0, 1.0)}, "weights must be >= 0"),
        ({"weights": (0.0, 0.0)}, "not both zero"),
        ({"kind": "hinge"}, "loss.kind='hinge'"),
        ({"tasks": []}, "at least one task"),
    ],
)
def test_bad_loss_configs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LossConfig(**kwargs)


def test_a_row_labelled_nan_adds_nothing_to_the_loss_or_its_gradient():
    """The full-batch solver pads a worker's last batch with rows labelled NaN."""
    logits = torch.tensor([[0.3], [-1.2], [2.0]], requires_grad=True)
    labels = torch.tensor([[1.0], [0.0], [float("nan")]])
    loss, _ = Loss(LossConfig())(logits, labels)
    loss.backward()
    kept = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[:2, 0].detach(), labels[:2, 0], reduction="sum"
    )
    assert float(loss) == pytest.approx(float(kept) / 3)  # the mean is still over the 3 rows
    assert logits.grad is not None and float(logits.grad[2, 0]) == 0.0

"""The references are fair bars: on two generated logs (the product's preparation), a planted
log of categorical fields only with 60k training rows and a Criteo-shaped log of 8k training rows
whose 26 fields have a long tail of rare ids (``tests.references.long_tail_prepared``), each
reference trained by the product's trainer with the baselines phase's default rules (every trial
of its grid, the best by validation kept; ``tests.references``, one gloo rank, no Ray; both logs'
tables are small, so the dense recipe) scores the test rows within 0.005 AUC of an independent
model of its kind trained on the same prepared split: scikit-learn's ``LogisticRegression`` (``C``
tuned on the validation rows over decades, one-hot features) for LR, a plain-PyTorch FM
(``nn.EmbeddingBag``, Adam, early stopping) for FM (the reference may beat it; it must not trail
it by more). The planted log's cases are ``extended`` (minutes; ``./run.sh test-extended``): the
long-tailed log's take the same path, from preparation through the baselines phase's rules to
the independent models, in the suite."""

from __future__ import annotations

import pytest

from benchmarks import independent as ind
from recsys.config import ExperimentConfig
from recsys.data.dataset import resolve
from tests.distributed.harness import run_ranks
from tests.references import (
    long_tail_prepared,
    planted_prepared,
    references_space,
    train_reference_rank,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
TOLERANCE = 0.005
LOGS = {  # what each log is prepared by
    "planted-60k": lambda folder: planted_prepared(folder, 100_000),  # 60k/20k/20k rows
    "long-tail-8k": lambda folder: long_tail_prepared(folder, 10_000),  # 8k/1k/1k rows
}
EXTENDED = {"planted-60k"}  # (minutes: ./run.sh test-extended)


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=[pytest.mark.extended] if name in EXTENDED else []) for name in LOGS
])  # fmt: skip
def log(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    prepared = LOGS[request.param](folder)
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared",
                                                       "paths": [prepared]}}))  # fmt: skip
    return folder, prepared, cfg, ind.arrays(cfg, [0])


def reference(log, arch: str) -> dict:
    folder, prepared, _, _ = log
    (folder / arch).mkdir()
    space = references_space(folder / arch, prepared, [arch])
    (got,) = run_ranks(train_reference_rank, space, arch, str(folder / arch / "runs"),
                       world_size=1, timeout=600)  # fmt: skip
    return got


def test_the_lr_reference_is_within_tolerance_of_scikit_learn(log):
    _, _, cfg, data = log
    sk = ind.sklearn_lr(data, cfg.embeddings.num_embeddings, ind.poolings(cfg))
    ref = reference(log, "lr")
    print(f"LR reference test AUC {ref['test']:.4f} ({ref['grid']}, peak at step {ref['step']}"
          f" of {ref['last_step']}); scikit-learn {sk.mean():.4f} ({sk.chosen}); "
          f"trials {ref['tried']}")  # fmt: skip
    assert abs(ref["test"] - sk.mean()) <= TOLERANCE
    assert ref["last_step"] > ref["step"]  # stopped by patience after its peak, not by the budget


def test_the_fm_reference_is_within_tolerance_of_a_plain_fm(log):
    _, _, cfg, data = log
    plain = ind.plain_fm(data, cfg, 16, lr=3e-3, max_epochs=40, patience=3)
    ref = reference(log, "fm")
    print(f"FM reference test AUC {ref['test']:.4f} ({ref['grid']}, peak at step {ref['step']}"
          f" of {ref['last_step']}); plain FM {plain.mean():.4f} (peak at epoch "
          f"{plain.peak:.1f}, stopped at {plain.epochs:.1f}); trials {ref['tried']}")  # fmt: skip
    assert plain.epochs > plain.peak  # the plain FM converged: stopped by patience
    assert ref["test"] >= plain.mean() - TOLERANCE

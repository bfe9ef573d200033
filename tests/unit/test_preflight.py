"""The driver refuses, before Ray starts, every configuration a worker would refuse
(``recsys.distributed.preflight``), and makes plain recipes trainable where FBGEMM's kernels lack
them: Adam on tables held dense on CPU workers, a ``dense`` kernel given its data-parallel type,
tables started from ``N(0, init_std^2)``."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from recsys.config import ExperimentConfig
from recsys.config_registry import named
from recsys.configlib import ConfigError
from recsys.distributed import preflight, sharding
from recsys.models.embeddings import TableInit, table_specs
from recsys.train.optim import RowwiseAdagrad, table_optimizer_factory

ROOT = Path(__file__).resolve().parents[2]
ADAM = {"optim.embedding_optimizer": "adam"}


def debug(**overrides: Any) -> ExperimentConfig:
    return named("debug").with_overrides(overrides)


def names(cfg: ExperimentConfig) -> list[str]:
    return [s.name for s in table_specs(cfg.tables)]


def test_adam_tables_on_cpu_are_held_dense_and_trained_by_torchs_adam():
    cfg = debug(**ADAM)
    cpu = preflight.for_device(cfg, "cpu")
    assert cpu.sharding.default.sharding_types == ["data_parallel"]
    assert cpu.sharding.default.compute_kernels == ["dense"]
    assert cpu.optim.dense_tables == "embedding" and cpu.optim.embedding_optimizer == "adam"
    assert preflight.for_device(cpu, "cpu") == cpu  # idempotent: the worker resolves it again
    assert preflight.for_device(cfg, "cuda") == cfg  # FBGEMM's fused Adam on GPUs
    assert preflight.for_device(debug(), "cpu") == debug()  # other optimizers: unchanged
    assert preflight.check(cfg, "cpu", 2) == cpu
    half = preflight.for_device(debug(**ADAM, **{"embeddings.dtype": "fp16"}), "cpu")
    assert half.embeddings.dtype == "fp32"  # dense replicas are fp32 (fp16: the fused storage)
    assert preflight.for_device(debug(**ADAM, **{"embeddings.dtype": "fp16"}), "cuda") == debug(
        **ADAM, **{"embeddings.dtype": "fp16"})  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "named_key"),
    [
        ({**ADAM, "embeddings.num_embeddings": [10**7] * 3}, "optim.embedding_optimizer='adam'"),
        ({**ADAM, "sharding.tables": {"t_cat_1": {"sharding_types": ["table_wise"]}}},
         "sharding.tables.t_cat_1.sharding_types"),
    ],
    ids=["too-large", "pinned"],
)  # fmt: skip
def test_adam_tables_that_cannot_be_held_dense_are_refused_naming_the_key(overrides, named_key):
    with pytest.raises(ConfigError) as e:
        preflight.for_device(debug(**overrides), "cpu")
    assert str(e.value).startswith(named_key), e.value
    assert "no fused Adam" in str(e.value)


def test_a_dense_kernel_alone_gets_the_data_parallel_type():
    cfg = debug(**{"sharding.default.compute_kernels": ["dense"]})
    given = sharding.constraints(cfg.sharding, names(cfg), "cpu")
    assert {tuple(c.sharding_types) for c in given.values()} == {("data_parallel",)}
    assert preflight.check(cfg, "cpu", 2) == cfg  # TorchRec's planner has a plan for each


def test_a_dense_kernel_no_type_can_meet_is_refused_naming_the_table():
    cfg = debug(**{"sharding.tables": {"t_cat_2": {"sharding_types": ["table_wise"],
                                                   "compute_kernels": ["dense"]}}})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        preflight.check(cfg, "cpu", 2)
    text = str(e.value)
    assert text.startswith("sharding.tables.t_cat_2 (table t_cat_2)"), text
    assert "data_parallel: dense" in text and "table_wise: fused" in text


def test_the_check_starts_no_ray():
    import ray

    preflight.check(debug(**ADAM), "cpu", 2)
    assert not ray.is_initialized()


# --- every ConfigError a worker raises, raised by the driver first -------------------------------

# The modules a training worker runs (besides building its config, which the driver did first):
# each ``raise ConfigError`` in them is a row below, keyed ``module:function``. A row says what
# triggers it and which call of the worker's raises it (None: the worker fails there with another
# error, e.g. TorchRec's planner's, which the driver's check stands in for); the test below shows
# ``preflight.check`` raises it first. A new raise on the worker's path fails the listing test
# until it has a row, and so until the driver checks it.
WORKER_PATH = ("recsys/train", "recsys/distributed", "recsys/models", "recsys/data/input",
               "recsys/data/prepared", "recsys/data/dataset.py")  # fmt: skip
DRIVER_ONLY = {  # raised only on the driver: (why)
    "recsys.data.dataset:source_for": "maps a --data path to its source while the driver "
    "resolves the config (with_data); a worker gets data.source set",
}


def fp16_dp() -> dict[str, Any]:
    return {"embeddings.dtype": "fp16", "sharding.default.sharding_types": ["data_parallel"]}


def worker_constraints(cfg: ExperimentConfig) -> Any:
    half = cfg.embeddings.dtype != "fp32"
    return sharding.constraints(cfg.sharding, names(cfg), "cpu", half)


def empty_folder() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="not-a-day-")


# module:function -> one (overrides, the worker's call or None) per raise in it
TRIGGERS: dict[str, list[tuple[Any, Any]]] = {
    "recsys.distributed.sharding:check_fused_decay": [
        ({"optim.embedding_weight_decay": 0.1},
         lambda c: sharding.check_fused_decay(c.optim, "cpu", False)),
    ],
    "recsys.distributed.sharding:constraints": [
        ({"sharding.tables": {"t_nope": {"sharding_types": ["table_wise"]}}}, worker_constraints),
    ],
    "recsys.distributed.sharding:_table_constraint": [
        (fp16_dp(), worker_constraints),
        ({"sharding.default.sharding_types": ["row_wise"]}, worker_constraints),
    ],
    "recsys.distributed.preflight:dense_adam": [
        ({**ADAM, "embeddings.num_embeddings": [10**7] * 3},
         lambda c: preflight.for_device(c, "cpu")),
        ({**ADAM, "sharding.tables": {"t_cat_1": {"sharding_types": ["table_wise"]}}},
         lambda c: preflight.for_device(c, "cpu")),
    ],
    "recsys.distributed.preflight:check_kernels": [
        ({"embeddings.dtype": "bf16"}, lambda c: preflight.check_kernels(c, "cpu")),
    ],
    "recsys.distributed.preflight:check_enumeration": [
        ({"sharding.default.sharding_types": ["table_wise"],
          "sharding.default.compute_kernels": ["dense"]}, None),  # the worker: TorchRec's planner
    ],
    "recsys.data.dataset:check_carried": [
        ({"embeddings.feature_names": [f"f{i}" for i in range(8)], "embeddings.weighted": ["f0"]},
         lambda c: __import__("recsys.data.dataset").data.dataset.check_carried(c)),
        ({"embeddings.feature_names": [f"f{i}" for i in range(8)],
          "embeddings.sequences": {"f0": 4}, "model.sequence.pooling": "sum"},
         lambda c: __import__("recsys.data.dataset").data.dataset.check_carried(c)),
        ({"train.monitor": "val_gauc"},  # synthetic rows have no groups
         lambda c: __import__("recsys.data.dataset").data.dataset.check_carried(c)),
    ],
    "recsys.data.dataset:with_budget": [
        ({"train.epochs": 1.0, "data.synthetic.num_samples": 2, "data.val_fraction": 0.3,
          "data.test_fraction": 0.3},  # (1 row each: none to train on)
         lambda c: __import__("recsys.data.dataset").data.dataset.with_budget(c, 0, 2)),
    ],
    "recsys.data.dataset:split_rows": [
        ({"train.epochs": 1.0, "data.split": "files"},
         lambda c: __import__("recsys.data.dataset").data.dataset.split_rows(c)),
    ],
    "recsys.data.dataset:prepared_meta": [
        ({"train.epochs": 1.0, "data.source": "prepared", "data.paths": ["a", "b"]},
         lambda c: __import__("recsys.data.dataset").data.dataset.prepared_meta(c)),
        ({"train.epochs": 1.0, "data.source": "prepared", "data.paths": ["/nonexistent/x"]},
         lambda c: __import__("recsys.data.dataset").data.dataset.prepared_meta(c)),
    ],
    "recsys.data.dataset:_torchrec_day_rows": [
        ({"train.epochs": 1.0, "data.source": "torchrec", "data.paths": ["@empty"]},
         lambda c: __import__("recsys.data.dataset").data.dataset.split_rows(c)),
    ],
}  # fmt: skip


def raise_sites() -> dict[str, int]:
    """``module:function`` -> how many ``raise ConfigError(...)`` it holds, over ``WORKER_PATH``."""
    files = [p for w in WORKER_PATH for p in ((ROOT / w).rglob("*.py") if (ROOT / w).is_dir()
                                              else [ROOT / w])]  # fmt: skip
    out: dict[str, int] = {}
    for path in files:
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            n = sum(
                1
                for r in ast.walk(fn)
                if isinstance(r, ast.Raise)
                and isinstance(r.exc, ast.Call)
                and getattr(r.exc.func, "id", None) == "ConfigError"
            )
            if n:
                out[f"{module}:{fn.name}"] = out.get(f"{module}:{fn.name}", 0) + n
    return out


def test_every_configerror_on_the_workers_path_is_listed():
    listed = {k: len(v) for k, v in TRIGGERS.items()}
    listed.update(dict.fromkeys(DRIVER_ONLY, 1))
    found = raise_sites()
    assert {k: found[k] for k in DRIVER_ONLY} == dict.fromkeys(DRIVER_ONLY, found.get(
        "recsys.data.dataset:source_for"))  # fmt: skip
    assert {k: v for k, v in found.items() if k not in DRIVER_ONLY} == {
        k: v for k, v in listed.items() if k not in DRIVER_ONLY
    }


def the_config(overrides: dict[str, Any]) -> ExperimentConfig:
    if overrides.get("data.paths") == ["@empty"]:
        overrides = {**overrides, "data.paths": [empty_folder()]}
    return debug(**overrides)


@pytest.mark.parametrize(
    ("site", "index"), [(k, i) for k, v in TRIGGERS.items() for i in range(len(v))]
)
def test_the_driver_raises_each_workers_configerror_first(site, index):
    overrides, worker_call = TRIGGERS[site][index]
    cfg = the_config(overrides)
    with pytest.raises(ConfigError) as driver:
        preflight.check(cfg, "cpu", 2)
    if worker_call is not None:
        with pytest.raises(ConfigError) as worker:
            worker_call(cfg)
        assert str(worker.value) in str(driver.value), (str(worker.value), str(driver.value))


# --- what the dense tables train with -----------------------------------------------------------


def test_rowwise_adagrad_on_a_whole_table_follows_fbggems_update():
    """``g' = g + wd w``; ``state += mean(g'^2)`` per row; ``w -= lr g' / (sqrt(state) + eps)``;
    decoupled: ``w *= 1 - lr wd`` first, the plain gradient after."""
    torch.manual_seed(0)
    w0, g = torch.randn(5, 4), torch.randn(5, 4)
    for decoupled in (False, True):
        w = torch.nn.Parameter(w0.clone())
        opt = RowwiseAdagrad([w], lr=0.1, eps=1e-8, weight_decay=0.5, decoupled=decoupled)
        for _ in range(2):
            w.grad = g.clone()
            opt.step()
        ref, state = w0.clone(), torch.zeros(5)
        for _ in range(2):
            if decoupled:
                ref = ref * (1 - 0.1 * 0.5)
                gg = g
            else:
                gg = g + 0.5 * ref
            state += (gg * gg).mean(1)
            ref = ref - 0.1 * gg / (state.sqrt() + 1e-8)[:, None]
        torch.testing.assert_close(w.detach(), ref)


def test_the_tables_optimizer_follows_the_embedding_optimizer():
    from recsys.config import OptimConfig

    p = [torch.nn.Parameter(torch.zeros(3, 4))]
    kinds = {"adam": torch.optim.AdamW, "exact_adagrad": torch.optim.Adagrad,
             "exact_sgd": torch.optim.SGD, "exact_rowwise_adagrad": RowwiseAdagrad}  # fmt: skip
    for kind, cls in kinds.items():
        opt = table_optimizer_factory(OptimConfig(embedding_optimizer=kind, embedding_lr=0.2))(p)
        assert type(opt) is cls and opt.param_groups[0]["lr"] == 0.2


def test_tables_start_from_a_normal_of_init_std_whatever_the_plan():
    init = TableInit(seed=7, low=-1.0, high=1.0, std=1e-2)
    whole = init.fill(torch.empty(2000, 16), 0, 0, 16)
    assert abs(float(whole.mean())) < 1e-3 and float(whole.std()) == pytest.approx(1e-2, rel=0.05)
    shard = init.fill(torch.empty(500, 8), 1000, 8, 16)  # rows 1000.., columns 8.. of the table
    torch.testing.assert_close(shard, whole[1000:1500, 8:16], atol=0, rtol=0)
    cfg = debug(**{"embeddings.init_std": 1e-4})
    from recsys.models.embeddings import table_inits

    assert {i.std for i in table_inits(cfg.tables, 0).values()} == {1e-4}
    with pytest.raises(ConfigError, match="embeddings.init_std"):
        debug(**{"embeddings.init_std": 0})


def test_a_refused_recsys_train_names_the_key_before_ray_starts(capsys):
    from recsys.cli.train import main

    os.environ.setdefault("RAY_ADDRESS", "local")
    with pytest.raises(SystemExit) as e:
        main(["--set", "optim.embedding_optimizer=adam", "--set", "embeddings.dim=4096"])
    assert str(e.value).startswith("error: optim.embedding_optimizer='adam'"), e.value
    assert "more than the 16,777,216 a worker keeps as a replica" in str(e.value)
    import ray

    assert not ray.is_initialized()

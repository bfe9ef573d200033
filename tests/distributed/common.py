"""Configs, rank functions and checks shared by the multi-process tests (importable by spawned
ranks): the CPU tests in this folder (gloo) and the GPU tests in ``tests/gpu`` (NCCL) run the same
rank functions and the same assertions. A test file never imports another test file."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recsys.config import ExperimentConfig
from tests.distributed.harness import run_ranks


def tiny_config(**overrides: Any) -> ExperimentConfig:
    """A tiny DLRM on synthetic data whose tables are really sharded on 2 ranks: small tables
    table-wise, the large one column-wise in two halves, one QR-split table."""
    base = {
        "embeddings": {
            "num_embeddings": [40, 60, 80, 900, 4000],
            "dim": 16,
            "qr": {"threshold": 1000, "collisions": 8},
        },
        "model": {"num_dense": 13, "bottom_mlp": [16], "top_mlp": [16]},
        "data": {"synthetic": {"num_samples": 3000, "seed": 2}},
        "train": {
            "steps": 12,
            "batch_size": 32,
            "eval_every": 6,
            "checkpoint_every": 6,
            "log_every": 2,
            "seed": 5,
        },
        "optim": {"lr": 0.05, "embedding_lr": 0.05},
        "sharding": {
            "default": {"sharding_types": ["table_wise"]},
            "tables": {"t_cat_3": {"sharding_types": ["column_wise"], "min_partition": 8}},
            "pipeline": "off",
        },
    }
    cfg = ExperimentConfig.from_dict(base)
    return cfg.with_overrides(overrides) if overrides else cfg


def copy_full_into_sharded(local: dict, full: dict) -> None:
    """Copy full (unsharded) tensors into a sharded state dict's local shards, in place."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for name, dst in local.items():
            src = full[name]
            if isinstance(dst, ShardedTensor):
                for shard in dst.local_shards():
                    (r0, c0), (r, c) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(src[r0 : r0 + r, c0 : c0 + c])
            else:
                dst.copy_(src)


def own_data_config(folder):
    """A tiny DLRM on a prepared folder (multi-hot bags, two tasks): the largest table QR-split,
    ``t_tags`` column-wise, the others table-wise."""
    from recsys.data.dataset import resolve
    from recsys.data.prepared.meta import read_meta

    sizes = read_meta(folder)["table_sizes"]
    cfg = ExperimentConfig.from_dict(
        {
            "data": {"source": "prepared", "paths": [folder]},
            "embeddings": {
                "dim": 16,
                "qr": {"threshold": sorted(sizes)[-2], "collisions": 8},
            },
            "model": {"bottom_mlp": [16], "top_mlp": [16]},
            "train": {"steps": 12, "batch_size": 32, "seed": 5},
            "optim": {"embedding_optimizer": "exact_adagrad"},
            "sharding": {
                "default": {"sharding_types": ["table_wise"]},
                "tables": {"t_tags": {"sharding_types": ["column_wise"], "min_partition": 8}},
                "pipeline": "off",
            },
        }
    )
    return resolve(cfg)


# --- the sharded model equals the unsharded one (test_sharded_equivalence.py, tests/gpu) ---

EQUIVALENCE_STEPS = 5


def global_batches(cfg, steps):
    """The batches rank 0 and rank 1 see at each step, concatenated = the global batch."""
    from recsys.data.input.loader import TrainStream, load_splits

    splits = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings)
    streams = [
        TrainStream(
            splits.train,
            rank=r,
            world_size=2,
            batch_size=cfg.train.batch_size,
            layout=cfg.embeddings.layout(),
            seed=cfg.train.seed,
            shuffle=True,
        )
        for r in range(2)
    ]
    return [[next(s) for s in streams] for _ in range(steps)]


def concat_batches(parts):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjts = [p.sparse_features for p in parts]
    keys = kjts[0].keys()
    values, lengths, weights = [], [], []
    weighted = kjts[0].weights_or_none() is not None
    for k in keys:
        for kjt in kjts:
            values.append(kjt[k].values())
            if weighted:
                weights.append(kjt[k].weights())
    for i, _ in enumerate(keys):
        for kjt in kjts:
            lengths.append(kjt.lengths().view(len(keys), -1)[i])
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        weights=torch.cat(weights) if weighted else None,
        lengths=torch.cat(lengths),
        stride=sum(k.stride() for k in kjts),
    )
    return Batch(
        torch.cat([p.dense_features for p in parts]), kjt, torch.cat([p.labels for p in parts])
    )


def unsharded_reference(cfg):
    """``cfg``'s model (any registered architecture) unsharded, with Adagrad on its tables (torch's
    AdamW where ``optim.embedding_optimizer`` is ``adam``) and Adagrad on its dense part."""
    from recsys.models import ModelAndLoss, build_model

    torch.manual_seed(cfg.train.seed)
    model = ModelAndLoss(build_model(cfg.model, cfg.embeddings, len(cfg.loss.tasks)), cfg.loss)
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    dense = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    o = cfg.optim
    table_opt = (
        torch.optim.AdamW(
            tables, lr=o.embedding_lr, eps=o.eps, weight_decay=o.embedding_weight_decay
        )
        if o.embedding_optimizer == "adam"
        else torch.optim.Adagrad(tables, lr=o.embedding_lr, eps=o.eps)
    )
    return model, [table_opt, torch.optim.Adagrad(dense, lr=o.lr, eps=o.eps)]


# regularised: layer norm in the MLPs, L2 decay on fp16 tables (FBGEMM's CPU kernel for fp32 tables
# drops the decay), row-wise Adagrad (the optimizer with L2), every table table-wise (row-wise
# Adagrad's state of a column-wise shard is the mean over the shard's columns only)
REGULARISED = {
    "model.norm": "layer",
    "embeddings.dtype": "fp16",
    "optim.embedding_optimizer": "exact_rowwise_adagrad",
    "optim.embedding_weight_decay": 0.5,
    "sharding.tables": {},
}


class SparseRowwiseAdagradL2:
    """FBGEMM's row-wise Adagrad with L2 decay on a table, unsharded and written out: only the rows
    a batch reads are updated (``g' = g + wd w``, ``state += mean(g'^2)``, ``w -= lr g' /
    (sqrt(state) + eps)``), then stored as fp16 as FBGEMM's CPU kernel does (round to nearest).
    ``wd`` weighs against the global batch's mean loss, as ``optim.embedding_weight_decay``."""

    def __init__(self, weight, features, lr, eps, wd):
        self.weight, self.features, self.lr, self.eps, self.wd = weight, features, lr, eps, wd
        self.state = torch.zeros(weight.shape[0])

    def step(self, kjt):
        rows = torch.cat([kjt[f].values() for f in self.features]).unique()
        with torch.no_grad():
            w = self.weight[rows]
            g = self.weight.grad[rows] + self.wd * w
            self.state[rows] += (g * g).mean(1)
            new = w - self.lr * g / (self.state[rows].sqrt() + self.eps)[:, None]
            self.weight[rows] = new.half().float()
        self.weight.grad = None


def regularised_reference(cfg):
    """``unsharded_reference`` of ``REGULARISED``: fp32 tables holding fp16 values, each updated
    by ``SparseRowwiseAdagradL2``; Adagrad on the dense part."""
    import dataclasses

    fp32 = dataclasses.replace(cfg, embeddings=dataclasses.replace(cfg.embeddings, dtype="fp32"))
    model, (_, dense) = unsharded_reference(fp32)
    ebc = model.model.sparse_arch.embedding_bag_collection
    opts = [dense]
    for table in ebc.embedding_bag_configs():
        weight = ebc.embedding_bags[table.name].weight
        with torch.no_grad():
            weight.copy_(weight.half().float())
        o = cfg.optim
        opts.append(SparseRowwiseAdagradL2(weight, table.feature_names, o.embedding_lr, o.eps,
                                           o.embedding_weight_decay))  # fmt: skip
    return model, opts


def without_dense(batch):
    """``batch`` with its dense features dropped, ``[B, 0]``: what the loader gives for data
    without dense columns (the synthetic data always has some)."""
    from torchrec.datasets.utils import Batch

    return Batch(batch.dense_features[:, :0], batch.sparse_features, batch.labels)


def equivalence_rank(
    rank, world, pipeline, use_gpu=False, dense=True, regularised=False, overrides=None
):
    """One rank of the comparison; ``use_gpu``: NCCL, ``cuda:rank``, and the smallest table
    row-wise (CUDA-only sharding) beside the table-wise and column-wise ones; ``dense=False``: a
    model without dense features (``model.num_dense=0``, no bottom MLP) fed ``[B, 0]`` ones;
    ``regularised``: ``REGULARISED`` against ``regularised_reference``; ``overrides``: more
    config keys (another ``model.arch``)."""
    from recsys.distributed.debug import describe, gather_table
    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.stepper import Stepper

    data_cfg = cfg = tiny_config(**{"optim.embedding_optimizer": "exact_adagrad"})
    if not dense:
        cfg = cfg.with_overrides({"model.num_dense": 0})
    if regularised:
        cfg = cfg.with_overrides(REGULARISED)
    if overrides:
        cfg = cfg.with_overrides(overrides)
    if use_gpu:
        row_wise = {"sharding_types": ["row_wise"]}
        tables = {**table_overrides(cfg), "t_cat_0": row_wise}
        cfg = cfg.with_overrides({"sharding.tables": tables})
    env = current(use_gpu=use_gpu)
    ref, ref_opts = regularised_reference(cfg) if regularised else unsharded_reference(cfg)
    built = build(cfg, env)
    dmp, optimizer, summary = built.model, built.optimizer, built.plan
    copy_full_into_sharded(dmp.state_dict(), ref.state_dict())
    # the pipeline reads two batches ahead
    batches = global_batches(data_cfg, EQUIVALENCE_STEPS + 3)
    if not dense:
        batches = [[without_dense(b) for b in step] for step in batches]
    mine = [b[rank].to(env.device) for b in batches]

    out = {"plan": summary["tables"], "sharded": [], "reference": []}
    out["bottom_mlp"] = [n for n in dmp.state_dict() if "dense_arch" in n]
    # the debug helper reassembles a column-wise table on rank 0
    out["gathered"] = None
    if summary["tables"]["t_cat_3"]["sharding_type"] != "data_parallel":  # (a replica: nothing to)
        full = gather_table(dmp, "t_cat_3")
        name = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_3.weight"
        out["gathered"] = (full, ref.state_dict()[name].clone()) if rank == 0 else None
    out["described"] = describe(dmp)
    with torch.no_grad():
        _, local = dmp(mine[0])
        _, full = ref(concat_batches(batches[0]))
    out["forward"] = (local["logits"].cpu(), full["logits"][rank * 32 : (rank + 1) * 32])
    stepper = Stepper(dmp, optimizer, env.device, pipeline)
    train_both(stepper, ref, ref_opts, mine, batches, rank, out)
    if pipeline:
        out["pipelined"] = [type(m).__name__ for m in stepper.pipeline._pipelined_modules]
    return out


def train_both(stepper, ref, ref_opts, mine, batches, rank, out):
    """``EQUIVALENCE_STEPS`` steps of the sharded model (this rank's batches) and of the reference
    (the global batches): both losses per step into ``out``, then both forwards on the next
    batch."""
    stream = iter(mine)
    for step in range(EQUIVALENCE_STEPS):
        out["sharded"].append(stepper(stream)["loss"].item())
        batch = concat_batches(batches[step])
        ref.zero_grad()
        ref_loss, _ = ref(batch)
        ref_loss.backward()
        for o in ref_opts:
            if isinstance(o, SparseRowwiseAdagradL2):
                o.step(batch.sparse_features)
            else:
                o.step()
        out["reference"].append(ref_loss.item())
    b = mine[EQUIVALENCE_STEPS].dense_features.shape[0]
    with torch.no_grad(), stepper.plain_model() as plain:
        _, local = plain(mine[EQUIVALENCE_STEPS])
        _, full = ref(concat_batches(batches[EQUIVALENCE_STEPS]))
    out["after"] = (local["logits"].cpu(), full["logits"][rank * b : (rank + 1) * b])


def table_overrides(cfg):
    return {k: {"sharding_types": v.sharding_types, "min_partition": v.min_partition}
            for k, v in cfg.sharding.tables.items()}  # fmt: skip


def assert_equal_to_unsharded(results, atol):
    """Each rank's forward before and after training equals the unsharded model's on its rows,
    and each step's global loss (the mean of the two ranks' local losses) the unsharded one."""
    for r in results:
        torch.testing.assert_close(*r["forward"], atol=atol, rtol=0)
        torch.testing.assert_close(*r["after"], atol=atol, rtol=0)
    for step in range(EQUIVALENCE_STEPS):
        sharded = (results[0]["sharded"][step] + results[1]["sharded"][step]) / 2
        assert abs(sharded - results[0]["reference"][step]) < atol


def check_against_unsharded(results, pipeline, atol, row_wise=False, column_wise=True):
    """The assertions on ``equivalence_rank``'s results (2 gloo ranks here, 2 NCCL ranks in
    ``tests/gpu``); ``column_wise=False``: every table table-wise (``REGULARISED``)."""
    if pipeline:  # the collection (QR tables included) is pipelined: input dist overlaps compute
        assert results[0]["pipelined"] == ["ShardedEmbeddingBagCollection"], results[0]
    plan = results[0]["plan"]
    kinds = {t: p["sharding_type"] for t, p in plan.items()}
    tw_ranks = {p["ranks"][0] for p in plan.values() if p["sharding_type"] == "table_wise"}
    assert tw_ranks == {0, 1}, plan
    if row_wise:
        assert kinds["t_cat_0"] == "row_wise" and sorted(plan["t_cat_0"]["ranks"]) == [0, 1]
    assert {"t_cat_4_q", "t_cat_4_r"} <= set(plan)  # the QR tables are sharded like any other
    if column_wise:
        assert kinds["t_cat_3"] == "column_wise" and sorted(plan["t_cat_3"]["ranks"]) == [0, 1]
        torch.testing.assert_close(*results[0]["gathered"], atol=0, rtol=0)
        held = [d for r in results for d in r["described"] if d["name"].endswith("t_cat_3.weight")]
        assert sorted(s["offsets"][1] for d in held for s in d["local_shards"]) == [0, 8]
    else:
        assert set(kinds.values()) == {"table_wise"}, plan
    assert_equal_to_unsharded(results, atol)
    assert results[0]["reference"][-1] < results[0]["reference"][0]


# --- resume is exact (test_resume.py, tests/gpu) ---

RESUME_STEPS = 6  # checkpoint and validation every RESUME_STEPS; 2 x RESUME_STEPS in all

OPTIMIZERS = {
    "adagrad": {},  # row-wise Adagrad on the tables, Adagrad on the rest (the defaults)
    "adam": {"optim.dense_optimizer": "adam"},  # FBGEMM's CPU kernels have no embedding Adam
    "sgd": {"optim.embedding_optimizer": "exact_sgd", "optim.dense_optimizer": "sgd"},
    # FBGEMM's fused Adam on the tables (its step counter restored by set_optimizer_step): GPU only
    "embedding_adam": {"optim.embedding_optimizer": "adam", "optim.dense_optimizer": "adam"},
    # the same on CPU workers: the tables held dense (data-parallel), trained by torch's Adam
    # (``recsys.distributed.preflight``), so no table may be pinned to another sharding type
    "dense_adam": {
        "optim.embedding_optimizer": "adam",
        "optim.dense_optimizer": "adam",
        "sharding.tables": {},
    },
    # dropout (its masks drawn from the saved RNG), batch norm (running statistics averaged over
    # the ranks before every checkpoint), decoupled decay on the tables (fp16: FBGEMM's CPU
    # kernel for fp32 tables drops it)
    "regularised": {
        "model.dropout": 0.2,
        "model.norm": "batch",
        "embeddings.dtype": "fp16",
        "optim.embedding_weight_decay": 0.1,
        "optim.embedding_weight_decay_mode": "decoupled",
    },
}


def resume_rank(
    rank, world, root, steps, pipeline="off", use_gpu=False, dtype="fp32", optim="adagrad",
    prefetch=2, extra=None,
):  # fmt: skip
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from recsys.distributed.env import current
    from recsys.train.build import build
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    cfg = tiny_config(
        **{
            "train.steps": steps,
            "train.checkpoint_every": RESUME_STEPS,
            "train.eval_every": RESUME_STEPS,
            "sharding.pipeline": pipeline,
            "embeddings.dtype": dtype,
            **OPTIMIZERS[optim],
            "data.prefetch": prefetch,
            **(extra or {}),
        }
    )
    reporter = LocalReporter(root, rank)
    env = current(use_gpu=use_gpu)
    metrics = Trainer(cfg, env, reporter, log=lambda s: None).train()
    folder = reporter.completed()[-1]
    extra = torch.load(f"{folder}/worker_{rank}.pt", weights_only=True)
    del extra["torch_rng"]
    assert ("cuda_rng" in extra) == use_gpu  # a GPU worker saves its device's generator too
    extra.pop("cuda_rng", None)
    cost = {k: extra.pop(k) for k in ("wall_s", "worker_s")}  # times differ between runs
    model = build(cfg, env).model
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    tensors = {
        k: [s.tensor.cpu() for s in v.local_shards()] if isinstance(v, ShardedTensor) else [v.cpu()]
        for k, v in state["model"].items()
    }
    history = [h for r in reporter.reports for h in r["loss_history"]]
    return {
        "metrics": metrics, "extra": extra, "cost": cost, "weights": tensors, "history": history
    }  # fmt: skip


# What a GPU resume is held to, and why. The worker runs deterministic kernels (cuBLAS's workspace
# setting, torch's deterministic algorithms: ``train.deterministic``) and FBGEMM's exact_*
# optimizers and embedding Adam sort rows before updating them, so the uninterrupted and the
# resumed run execute the same kernels on the same batches from the same state (the CUDA RNG is
# restored) and should agree bitwise. 1e-6 (a few float32 units in the last place at the weights'
# scale) is headroom for NCCL: the resumed run makes a new communicator, and NCCL does not promise
# the same reduction algorithm (ring or tree, channel count) for it, so a dense all-reduce may sum
# in another order. A half-precision table rounds its update stochastically; a float32 difference
# that small moves a row by at most one unit in the table's last place, hence ``resume_rtol``.
GPU_RESUME_ATOL = 1e-6


def resume_rtol(dtype: torch.dtype) -> float:
    """The relative tolerance of a GPU resume for a tensor of ``dtype``: one unit in the last
    place of a half-precision table, none for float32 (``atol`` covers it)."""
    return float(torch.finfo(dtype).eps) if dtype in (torch.float16, torch.bfloat16) else 0.0


def check_resume_is_exact(
    tmp_path,
    pipeline,
    atol,
    use_gpu=False,
    dtype="fp32",
    backend="gloo",
    world_size=2,
    optim="adagrad",
):
    """2K steps straight vs K, stop, resume, K more (K = ``RESUME_STEPS``; on gloo here, on NCCL
    in ``tests/gpu``). ``atol``: 0 (bitwise) on CPU; on GPUs ``GPU_RESUME_ATOL``, where
    fp16/bf16 tables may also differ by one unit in their last place (``resume_rtol``)."""

    def train(folder, steps):
        args = (str(tmp_path / folder), steps, pipeline, use_gpu, dtype, optim)
        return run_ranks(resume_rank, *args, backend=backend, world_size=world_size)

    straight = train("a", 2 * RESUME_STEPS)
    first = train("b", RESUME_STEPS)
    resumed = train("b", 2 * RESUME_STEPS)
    for s, f, r in zip(straight, first, resumed, strict=True):
        # the best report's score is a float of the run's arithmetic: equal on CPU, within
        # ``atol`` on GPUs, as the metrics below; the rest of the state exactly (its best step
        # too: deterministic kernels repeat the reports' order, which ``atol`` cannot reverse
        # unless two reports are within it)
        exact = {k: v for k, v in s["extra"].items() if k != "best"}
        assert {k: v for k, v in r["extra"].items() if k != "best"} == exact
        assert exact["step"] == 2 * RESUME_STEPS
        best = s["extra"]["best"], r["extra"]["best"]
        assert best[0] == (pytest.approx(best[1], abs=atol) if atol else best[1])
        # the cost goes on from the checkpoint: samples of every rank, seconds of both attempts
        assert r["extra"]["samples_seen"] == 2 * RESUME_STEPS * world_size * 32
        assert r["cost"]["wall_s"] > f["cost"]["wall_s"] > 0
        assert r["cost"]["worker_s"] == pytest.approx(world_size * r["cost"]["wall_s"])
        assert r["metrics"]["wall_s"] == r["cost"]["wall_s"]
        assert s["metrics"]["loss"] == pytest.approx(r["metrics"]["loss"], abs=atol)
        assert s["metrics"]["val_auc"] == pytest.approx(r["metrics"]["val_auc"], abs=atol)
        for name, tensor in s["weights"].items():
            rtol = resume_rtol(tensor[0].dtype) if atol else 0.0
            torch.testing.assert_close(tensor, r["weights"][name], atol=atol, rtol=rtol)
    # the resumed run reported only the steps after the checkpoint: no step twice
    assert [step for step, _ in resumed[0]["history"]] == [8, 10, 12]
    assert [step for step, _ in straight[0]["history"]] == [2, 4, 6, 8, 10, 12]


def check_pipeline_equals_plain(tmp_path, atol, use_gpu=False, backend="gloo"):
    plain, piped = (
        run_ranks(
            resume_rank, str(tmp_path / p), RESUME_STEPS, p, use_gpu, backend=backend, world_size=1
        )[0]
        for p in ("off", "on")
    )
    assert piped["metrics"]["loss"] == pytest.approx(plain["metrics"]["loss"], abs=atol)
    for name, tensor in plain["weights"].items():
        torch.testing.assert_close(piped["weights"][name], tensor, atol=atol, rtol=0)


# --- export of a trained checkpoint (test_export.py, tests/gpu) ---

INT8_MAX_PROB_DIFF = 0.02  # row-wise INT8 tables: |p_int8 - p_fp32| on every test row


EXPORT_ROWS = 64  # the test rows both ranks score in-process after training (``export_rank``)


def export_rank(rank, world, root, use_gpu=False, arch="dlrm"):
    """Train ``export_config(arch)`` to its checkpoint; returns this rank's logits of the first
    ``EXPORT_ROWS`` test rows from the trained model in eval mode, in process (``[R, T]``)."""
    from recsys.data.input.loader import load_splits, to_batch
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    cfg, env = export_config(arch), current(use_gpu)
    trainer = Trainer(cfg, env, LocalReporter(root, rank), log=lambda s: None)
    trainer.train()
    test = load_splits(cfg.data, cfg.model.num_dense, cfg.embeddings.num_embeddings).test
    batch = to_batch(test.read(0, EXPORT_ROWS), cfg.embeddings.layout())
    model = trainer.stepper.model.eval()
    with torch.no_grad():
        _, out = model(batch.to(env.device))
    return out["logits"].cpu()


def export_config(arch="dlrm"):
    """A tiny DLRM with mixed dims, batch norm and dropout (or reference model ``arch``, one
    table width), trained 30 steps."""
    mixed = {"embeddings.dims": [8, 16, 8, 16, 16]} if arch == "dlrm" else {}  # `dot` projects
    return tiny_config(
        **{
            "model.arch": arch,
            "model.norm": "batch",
            "model.dropout": 0.2,
            "train.steps": 30,
            "train.checkpoint_every": 30,
            "train.eval_every": 30,
            **mixed,
            "sharding.tables": {},
        }
    )


def own_data_cfg(folder, model=None):
    """The own-data demo config, trained 30 steps with one checkpoint and one evaluation;
    ``model``: dotted ``model.*`` overrides (another architecture or task sharing)."""
    return own_data_config(folder).with_overrides(
        {"train.steps": 30, "train.checkpoint_every": 30, "train.eval_every": 30, **(model or {})}
    )


def own_data_rank(rank, world, folder, root, model=None):
    """One rank of training `own_data_cfg(folder, model)`, reporting under `root`."""
    from recsys.distributed.env import current
    from recsys.train.reporting import LocalReporter
    from recsys.train.trainer import Trainer

    reporter = LocalReporter(root, rank)
    Trainer(own_data_cfg(folder, model), current(False), reporter, log=lambda s: None).train()


def raw_test_rows(folder):
    """The raw rows that became the prepared test split, in order, as a DataFrame."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.prepared.meta import read_meta
    from recsys.data.schema import DatasetSchema
    from recsys.prepare.splits import TEST, SplitPlan, split_of
    from recsys.serving.mlflow_model import plain_columns

    meta = read_meta(folder)
    schema = DatasetSchema.from_dict(meta["schema"])
    table = pa.concat_tables(pq.read_table(f) for f in meta["sources"])
    split = split_of(table, schema, SplitPlan("time", cuts=tuple(meta["split"]["time_cuts"])))
    return plain_columns(table.filter(pa.array(split == TEST)).to_pandas())

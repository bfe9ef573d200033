"""Guards, on CPU, of the mistakes that only break multi-GPU runs (issue 12). What a CPU cannot
check is covered by ``./run.sh gpu-check`` (tests marked ``gpu``)."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import pytest
import torch

from recsys.configlib import ConfigError
from recsys.distributed import checkpoint, collectives
from recsys.distributed.env import PlacementError, check_placement
from recsys.runtime.cluster import node_slots, placement_strategy

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "scatter", "reduce", "reduce_scatter",
    "all_to_all", "all_to_all_single", "barrier", "send", "recv",
}  # fmt: skip


def test_no_module_but_collectives_calls_a_collective():
    """NCCL serves CUDA tensors only; gloo hides a CPU tensor in a collective. So every collective
    goes through recsys/distributed/collectives.py, whose helpers take the device."""
    offenders = []
    for path in (ROOT / "recsys").rglob("*.py"):
        if path.name == "collectives.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTIVES
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "dist"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} dist.{node.func.attr}")
    assert offenders == []


def test_every_tensor_made_for_a_collective_names_its_device():
    tree = ast.parse((ROOT / "recsys/distributed/collectives.py").read_text())
    made = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("tensor", "zeros", "ones", "empty", "full")
    ]
    assert made and all(any(k.arg == "device" for k in n.keywords) for n in made)


def test_collective_device_is_the_current_gpu_under_nccl(monkeypatch):
    monkeypatch.setattr(collectives, "_initialised", lambda: True)
    monkeypatch.setattr(collectives.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for world in (1, 2):  # a one-rank NCCL group's too (gpu-check on one GPU)
        monkeypatch.setattr(collectives, "_world", lambda world=world: world)
        assert collectives.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(collectives.dist, "get_backend", lambda: "gloo")
    assert collectives.collective_device() == torch.device("cpu")


def test_placement_one_node_when_it_fits_else_whole_nodes():
    gpus = node_slots([{"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 8}], cpus=4, gpus=1)
    assert gpus == [8, 8]
    assert placement_strategy(4, gpus) == "STRICT_PACK"  # never 1 + 3 over two nodes
    assert placement_strategy(8, gpus) == "STRICT_PACK"
    assert placement_strategy(16, gpus) == "PACK"  # two whole nodes
    with pytest.raises(ConfigError, match="cannot fill whole nodes evenly: use at most 8"):
        placement_strategy(12, gpus)


def test_uneven_placement_fails_fast_naming_the_nodes():
    check_placement([("a", 0, 2), ("a", 1, 2), ("b", 0, 2), ("b", 1, 2)])  # 2 + 2: fine
    with pytest.raises(PlacementError, match=r"4 workers are spread unevenly over 2 nodes"):
        check_placement([("a", 0, 1), ("b", 0, 3), ("b", 1, 3), ("b", 2, 3)])  # 1 + 3
    with pytest.raises(PlacementError, match="LOCAL_WORLD_SIZE"):
        check_placement([("a", 0, 2), ("b", 0, 2), ("a", 1, 2), ("b", 1, 2)])  # interleaved


def _big_model(dim: int):
    from recsys.config_registry import named
    from recsys.models import DLRM, ModelAndLoss
    from recsys.models.embeddings import table_specs

    cfg = named("criteo_kaggle").with_overrides({"embeddings.dim": dim})
    model = ModelAndLoss(DLRM(cfg.model, cfg.embeddings, 1, embedding_device="meta"), cfg.loss)
    return cfg, model, [s.name for s in table_specs(cfg.embeddings)]


def test_planner_is_told_the_real_gpu_memory_and_the_batch_size():
    from recsys.distributed.sharding import Machine, planner, sharders, topology

    cfg, model, names = _big_model(dim=256)  # Kaggle tables at dim 256: 35 GB, over 32 GiB
    kernels = {}
    for hbm in (32 * 2**30, 80 * 2**30):  # TorchRec's default vs an H100
        p, _ = planner(cfg.sharding, names, Machine("cuda", hbm, 256 * 2**30), 1, 1, 2048)
        plan = p.plan(model, sharders(cfg.optim))
        kernels[hbm] = {ps.compute_kernel for mp in plan.plan.values() for ps in mp.values()}
    assert kernels[80 * 2**30] == {"fused"}  # all tables in HBM on an 80 GB GPU
    assert kernels[32 * 2**30] != {"fused"}  # 32 GiB forces UVM caching for some tables
    estimates = []
    for batch in (512, 8192):
        p, est = planner(cfg.sharding, names, Machine("cuda", 80 * 2**30, 2**40), 1, 1, batch)
        p.plan(model, sharders(cfg.optim))
        estimates.append(est.hbm[0])
    assert estimates[1] > estimates[0]  # the batch size reaches the planner's estimate
    cpu = topology(2, 2, Machine("cpu", None, 10 * 2**30))
    assert [(d.storage.hbm, d.storage.ddr) for d in cpu.devices] == [(0, 10 * 2**30)] * 2
    assert cpu.local_world_size == 2 and cpu.compute_device == "cpu"


def test_on_gpus_every_table_stays_in_the_fused_optimizer_unless_pinned_data_parallel():
    """TorchRec's planner makes small tables data-parallel on GPUs, where the dense optimizer
    would train them at optim.lr; only a table whose sharding names data_parallel is."""
    from recsys.config import TableSharding
    from recsys.distributed.sharding import Machine, planner, sharders

    cfg, model, names = _big_model(dim=16)
    gpus = Machine("cuda", 80 * 2**30, 256 * 2**30)

    def kinds(sharding):
        p, _ = planner(sharding, names, gpus, 2, 2, 2048)
        plan = p.plan(model, sharders(cfg.optim))
        return {t: (ps.sharding_type, ps.compute_kernel) for mp in plan.plan.values()
                for t, ps in mp.items()}  # fmt: skip

    free = kinds(cfg.sharding)
    assert {k for _, k in free.values()} == {"fused"}
    assert "data_parallel" not in {t for t, _ in free.values()}
    pinned = dataclasses.replace(cfg.sharding, tables={names[0]: TableSharding(["data_parallel"])})
    assert kinds(pinned)[names[0]] == ("data_parallel", "dense")


def test_machine_of_a_gpu_worker_reads_its_gpu_and_shares_host_memory(monkeypatch):
    from recsys.distributed import sharding
    from recsys.distributed.env import WorkerEnv

    props = type("Props", (), {"total_memory": 85_000_000_000})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(sharding, "host_memory_bytes", lambda: 8 * 2**40)
    env = WorkerEnv(rank=9, world_size=16, local_rank=1, local_world_size=8,
                    device=torch.device("cuda", 1))  # fmt: skip
    assert sharding.Machine.of(env) == sharding.Machine("cuda", 85_000_000_000, 2**40)


def test_host_memory_is_shared_by_every_worker_the_sweep_may_place_on_a_node(monkeypatch):
    """With --max-concurrent trials on one node, the planner's host memory per worker (UVM
    placement) is the node's over all their workers, in the sweep's check and in the workers."""
    import recsys.runtime.cluster
    from recsys.distributed import sharding
    from recsys.distributed.env import WorkerEnv
    from recsys.tune.state import SweepOptions
    from recsys.tune.sweep import machine_spec
    from recsys.tune.trial import TrialSpec, trial_resources

    monkeypatch.setattr(recsys.runtime.cluster, "node_host_memory", lambda cpus, gpus: 48 * 2**30)
    nodes = [{"CPU": 8.0}]  # 8 worker slots of 1 CPU
    shares = {}
    for concurrent in (1, 3, 10):
        opts = SweepOptions(
            name="s", storage="/x", tracking_uri="sqlite://", max_concurrent=concurrent,
            num_workers=2, cpus_per_worker=1.0,
        )  # fmt: skip
        spec = machine_spec(opts, nodes)
        shares[concurrent] = (spec["node_workers"], spec["ddr"], spec["local_world_size"])
    assert shares == {1: (2, 24 * 2**30, 2), 3: (6, 8 * 2**30, 2), 10: (8, 6 * 2**30, 2)}
    trial = TrialSpec(sweep="s", base={}, storage="/x", tracking_uri="sqlite://", experiment_id="1",
                      parent_run_id="p", num_workers=2, use_gpu=False, cpus_per_worker=1.0,
                      max_failures=0, machine=machine_spec(opts, nodes))  # fmt: skip
    assert trial_resources(trial).node_workers == 8
    monkeypatch.setattr(sharding, "host_memory_bytes", lambda: 48 * 2**30)
    env = WorkerEnv(rank=0, world_size=2, local_rank=0, local_world_size=2,
                    device=torch.device("cpu"), node_workers=8)  # fmt: skip
    assert sharding.Machine.of(env).ddr == 6 * 2**30
    alone = dataclasses.replace(env, node_workers=0)  # recsys-train: its own workers
    assert sharding.Machine.of(alone).ddr == 24 * 2**30


def test_batches_are_pinned_only_on_gpu_workers(monkeypatch):
    import numpy as np
    from torchrec.datasets.utils import Batch

    from recsys.config import SparseLayout
    from recsys.data import Columns
    from recsys.data.input.loader import TrainStream
    from recsys.train.trainer import pin_batches

    pinned = []
    monkeypatch.setattr(Batch, "pin_memory", lambda self: pinned.append(self) or self)
    cols = Columns(np.zeros((8, 2), np.float32), np.zeros((8, 1, 1), np.int64),
                   np.zeros((8, 1), np.float32))  # fmt: skip
    kw = {"rank": 0, "world_size": 1, "batch_size": 4, "layout": SparseLayout(["a"], [5])}
    next(TrainStream(cols, seed=0, shuffle=False, pin_memory=True, **kw))
    next(TrainStream(cols, seed=0, shuffle=False, pin_memory=False, **kw))
    assert len(pinned) == 1
    assert pin_batches(torch.device("cuda", 0)) and not pin_batches(torch.device("cpu"))


def test_the_prefetch_thread_makes_the_workers_gpu_current_before_it_pins(monkeypatch):
    """Pinning in a thread whose current device is GPU 0 puts every worker of a node on GPU 0
    (torch's DataLoader pin thread sets the device first): the thread sets the worker's GPU
    before it asks the source for a batch; on a CPU worker it makes no CUDA call."""
    import threading

    from recsys.data.input.prefetch import Prefetcher

    events: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("set", d)))

    def batches():
        events.append(("batch", threading.current_thread().name))
        yield 1

    p = Prefetcher(batches(), depth=1, device=torch.device("cuda", 3))
    assert list(p) == [1]
    p.close()
    assert events == [("set", torch.device("cuda", 3)), ("batch", "recsys-prefetch")]
    events.clear()
    assert list(Prefetcher(batches(), depth=1, device=torch.device("cpu"))) == [1]
    assert events == [("batch", "recsys-prefetch")]


def test_the_killed_worker_test_kills_a_rank_that_exists_on_one_worker_too(tmp_path):
    """gpu-check's one-GPU kill item runs one worker: the killing rank must be one it has."""
    from tests.helpers import kills_itself

    marker = str(tmp_path / "killed")
    assert kills_itself(0, 1, 60, 60, marker)
    assert kills_itself(1, 2, 60, 60, marker) and not kills_itself(0, 2, 60, 60, marker)
    assert not kills_itself(0, 1, 50, 60, marker)
    open(marker, "w").close()
    assert not kills_itself(0, 1, 60, 60, marker)


class StandInTBE(torch.nn.Module):
    """FBGEMM's training TBE's step counter as its forward keeps it: ``iter_cpu`` synced from
    the ``iter`` buffer while 0, then both advanced, in eval mode too (embedding Adam's bias
    correction; FBGEMM's CPU kernels have no Adam, so only this stand-in shows it on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("iter", torch.zeros(1, dtype=torch.int64))
        self.iter_cpu = torch.zeros(1, dtype=torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.iter_cpu.item() == 0:
            self.iter_cpu.fill_(int(self.iter.item()))
        self.iter_cpu.add_(1)
        self.iter.add_(1)
        return x


def test_evaluation_leaves_the_embedding_optimizers_step_counter_where_training_left_it():
    import numpy as np

    from recsys.config import ExperimentConfig
    from recsys.data import Columns
    from recsys.distributed.env import WorkerEnv
    from recsys.train.evaluation import evaluate

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tbe = StandInTBE()

        def forward(self, batch):
            self.tbe(batch.dense_features)
            n = len(batch.labels)
            return None, {"logits": torch.arange(n, dtype=torch.float32)[:, None],
                          "labels": batch.labels}  # fmt: skip

    cfg = ExperimentConfig().with_overrides({"train.batch_size": 4, "model.num_dense": 2})
    n, f = 10, cfg.embeddings.num_features
    split = Columns(np.zeros((n, 2), np.float32), np.zeros((n, f, 1), np.int64),
                    (np.arange(n) % 2)[:, None].astype(np.float32))  # fmt: skip
    env = WorkerEnv(0, 1, 0, 1, torch.device("cpu"))
    model = Model()
    for _ in range(3):  # three training steps
        model.tbe(torch.zeros(1))
    evaluate(model, split, cfg, env, "val")  # three batches of 4
    assert int(model.tbe.iter.item()) == 3 and int(model.tbe.iter_cpu.item()) == 3
    model.tbe(torch.zeros(1))  # the next training step counts on from there
    assert int(model.tbe.iter.item()) == 4 and int(model.tbe.iter_cpu.item()) == 4


def test_gpu_workers_run_deterministic_kernels_unless_told_not_to(monkeypatch):
    """A resumed GPU run repeats the uninterrupted one only with deterministic cuBLAS and torch
    kernels: a GPU worker sets them (train.deterministic, on by default), a CPU worker is left
    alone, and the Trainer calls it before it builds anything."""
    from recsys.config import TrainConfig
    from recsys.distributed.env import deterministic_kernels
    from recsys.train import trainer

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.utils.deterministic.fill_uninitialized_memory)  # fmt: skip
    try:
        deterministic_kernels(torch.device("cpu"))
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        assert not torch.are_deterministic_algorithms_enabled()
        deterministic_kernels(torch.device("cuda", 0))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.utils.deterministic.fill_uninitialized_memory  # no extra write a step
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:4]
        torch.utils.deterministic.fill_uninitialized_memory = before[4]
    assert TrainConfig().deterministic
    source = Path(trainer.__file__).read_text()
    init = source[source.index("    def __init__") : source.index("load_splits(")]
    assert "deterministic_kernels(env.device)" in init


def test_cuda_rng_state_is_saved_and_restored_per_device(monkeypatch):
    calls = []
    state = torch.arange(16, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: calls.append(device) or state)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s, device: calls.append(("set", device, s))
    )
    gpu = torch.device("cuda", 2)
    saved = checkpoint.rng_states(gpu)
    assert calls == [gpu] and torch.equal(saved["cuda_rng"], state)
    checkpoint.set_rng_states({**saved, "step": 7}, gpu, rank=1)
    assert calls[-1][:2] == ("set", gpu) and torch.equal(calls[-1][2], state)
    assert "cuda_rng" not in checkpoint.rng_states(torch.device("cpu"))
    # a CPU worker's checkpoint resumed on a GPU (a sweep resumed with --gpus): the GPU's
    # generator is seeded as a new rank's, from the saved step and the rank
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: calls.append(("seed", seed)))
    checkpoint.set_rng_states({"torch_rng": torch.get_rng_state(), "step": 7}, gpu, rank=1)
    assert calls[-1] == ("seed", checkpoint.new_rank_seed(7, 1))


def test_export_loads_bf16_tables_into_fp32(tmp_path):
    """bf16 values beyond fp16's range (65504) survive the export's load; TorchRec's unsharded
    collection would have made the table fp16 and the value inf."""
    import torch.distributed.checkpoint as dcp

    from recsys.models import DLRM, ModelAndLoss, materialize
    from recsys.serving.export import load_fp32
    from tests.distributed.common import tiny_config

    cfg = tiny_config(**{"embeddings.dtype": "bf16"})
    fp32 = dataclasses.replace(cfg.embeddings, dtype="fp32")
    model = ModelAndLoss(materialize(DLRM(cfg.model, fp32, 1)), cfg.loss)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    key = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight"
    state[key] = torch.full_like(state[key], 1.0e5).to(torch.bfloat16)  # as a bf16 run saves it
    dcp.save({"model": state}, checkpoint_id=str(tmp_path), no_dist=True)
    loaded = load_fp32(cfg, str(tmp_path))
    table = loaded.model.sparse_arch.embedding_bag_collection.embedding_bags["t_cat_0"].weight
    assert table.dtype == torch.float32
    assert torch.isfinite(table).all() and table.max().item() == pytest.approx(1.0e5, rel=1e-2)


def test_host_memory_is_the_containers_limit_where_it_is_lower(monkeypatch, tmp_path):
    """One rule for host memory, in workers and in the sweep's check: physical, capped by cgroup."""
    import builtins

    from recsys.runtime import cluster

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = {"/sys/fs/cgroup/memory.max": "max", "/sys/fs/cgroup/memory/memory.limit_in_bytes": ""}
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if path in limits:
            (tmp_path / "limit").write_text(limits[path])
            return real_open(tmp_path / "limit", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert cluster.host_memory_bytes() == physical  # "max": no limit
    limits["/sys/fs/cgroup/memory.max"] = str(2**30)
    assert cluster.host_memory_bytes() == 2**30
    limits["/sys/fs/cgroup/memory.max"] = str(physical * 4)
    assert cluster.host_memory_bytes() == physical


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops a block runs (a CPU stand-in for what would copy an index to a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("columns", [[0], [0, 1], [1, 2], [2, 0]])
def test_task_labels_are_picked_without_an_index_made_on_the_host(columns):
    """``labels[:, [..]]`` on a CUDA tensor makes its index on the host and copies it over, a
    device sync every step; the loss picks its columns as a view or one by one instead."""
    from recsys.config import LossConfig, TaskConfig
    from recsys.models.loss import Loss

    tasks = [TaskConfig(name=f"t{c}", label_column=c) for c in columns]
    loss = Loss(LossConfig(tasks=tasks))
    labels = torch.rand(5, 3)
    with _Ops() as seen:
        picked = loss.select_labels(labels)
    assert torch.equal(picked, labels[:, columns])
    assert not [op for op in seen.ops if op.startswith(("aten.index.", "aten.lift_fresh"))]


def test_an_evaluation_batch_is_added_without_waiting_for_the_device():
    """Padding rows weigh 0 in the metrics' sums (a boolean index counts its rows on the host,
    which waits for a GPU at every batch), and the ranking rows stay on the device until the
    split's end; the figures equal those of the valid rows alone."""
    from recsys.train.metrics import GroupAUC, MetricState

    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(64, 2, generator=gen), (torch.rand(64, 2, generator=gen) > 0.6)
    valid = torch.arange(64) < 50
    groups = torch.randint(1, 9, (64,), generator=gen)
    state, ranking = MetricState(2, torch.device("cpu"), bits=12), GroupAUC(2, torch.device("cpu"))
    with _Ops() as seen:
        state.update(logits, labels.float(), valid)
        ranking.update(groups, logits, labels.float(), valid)
    waits = ("aten.index.Tensor", "aten.nonzero", "aten._local_scalar_dense", "aten.masked_select")
    assert not [op for op in seen.ops if op.startswith(waits)]
    alone = MetricState(2, torch.device("cpu"), bits=12)
    alone.update(logits[:50], labels[:50].float(), torch.ones(50, dtype=torch.bool))
    for t in range(2):
        got, want = state.compute(t), alone.compute(t)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    ranking.finish(world_size=1)
    one = GroupAUC(2, torch.device("cpu"))
    one.update(groups[:50], logits[:50], labels[:50].float(), torch.ones(50, dtype=torch.bool))
    one.finish(world_size=1)
    assert torch.equal(ranking.sums, one.sums)

"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

A checkpoint directory holds one ``__<rank>_0.distcp`` shard file per rank and ``.metadata``
(model incl. sharded tables, fused and dense optimizer state), plus one small
``worker_<rank>.pt`` per rank with what differs between ranks: step, data position and the RNG
states: the CPU generator's and, on a GPU worker, its device's (FBGEMM's fp16/bf16 tables round
stochastically in backward with the CUDA generator, so an exact resume needs it). Everything
loads with DCP or ``torch.load(weights_only=True)``: no arbitrary pickles.

A checkpoint loads on any number of workers and any sharding plan. DCP reshards the tables and
the optimizer state (fused and dense) to the loading plan, exactly, except the row-wise state of a
table whose number of column shards changed, which is mapped by the rule in
``recsys.distributed.rowwise_state`` and named in ``TrainState.remapped``. What is per rank
follows a rule (``load``): step and best report are the same on every rank; rank ``r`` takes
rank ``r``'s RNG states if the saving run had that rank, else a generator seeded from the step
and ``r``; the data position is mapped by the trainer (``recsys.data.input.loader.map_position``).

With Ray Train every rank saves into its own local folder and reports it; Ray merges the folders
into one checkpoint directory on the run's storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from recsys.distributed import rowwise_state

CPU = torch.device("cpu")


@dataclass
class TrainState:
    """The loop's own state: steps done, rows this worker has consumed, and the run's best
    validation report so far (``best``: the monitored metric's best value, NaN before the first;
    ``stale``: reports with validation since it improved), so a restarted worker keeps scoring
    and early-stopping where it was."""

    step: int = 0
    data_position: int = 0
    best: float = float("nan")
    best_step: int = 0
    stale: int = 0
    shard_rows: int = 0  # rows of the data shard that data_position counts in (0: not known)
    saved_world_size: int = 0  # workers of the run whose checkpoint this came from (0: fresh)
    # what the run cost up to this checkpoint, over all its attempts and worker counts: wall
    # seconds, seconds times workers (GPU-seconds on GPU workers), training samples (all ranks)
    wall_s: float = 0.0
    worker_s: float = 0.0
    samples_seen: int = 0
    # tables whose row-wise optimizer state was mapped to this plan's column shards (as
    # ``"t_x (2 column shards -> 1 shard of all columns)"``); empty when the plan kept the layout
    remapped: tuple[str, ...] = ()


def _worker_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"worker_{rank}.pt")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt or unwritable."""


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """The generators a worker's training draws from: CPU, and its GPU's on a GPU worker."""
    out = {"torch_rng": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda_rng"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_states(saved: dict[str, Any], device: torch.device, rank: int) -> None:
    """Restore the generators ``rng_states`` saved. A GPU worker resuming a CPU worker's
    checkpoint (a sweep resumed with ``--gpus``) finds no CUDA state: its GPU's generator is
    seeded as a new rank's is (``seed_new_rank``), from the saved step and its rank."""
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda":
        if "cuda_rng" in saved:
            torch.cuda.set_rng_state(saved["cuda_rng"], device)
        else:
            torch.cuda.manual_seed(new_rank_seed(int(saved["step"]), rank))


def save(
    folder: str,
    model: nn.Module,
    optimizer: Any,
    state: TrainState,
    rank: int,
    world_size: int,
    device: torch.device = CPU,
) -> None:
    """Write this rank's part of a checkpoint into ``folder`` (collective: all ranks call it).

    A full disk or an unwritable folder raises ``CheckpointError`` naming the folder; the
    previous checkpoint lives in another folder and stays valid."""
    try:
        os.makedirs(folder, exist_ok=True)
        dcp.save(
            {"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=folder
        )
        torch.save(
            {
                "step": state.step,
                "data_position": state.data_position,
                "best": state.best,
                "best_step": state.best_step,
                "stale": state.stale,
                "shard_rows": state.shard_rows,
                "world_size": world_size,
                "wall_s": state.wall_s,
                "worker_s": state.worker_s,
                "samples_seen": state.samples_seen,
                **rng_states(device),
            },
            _worker_file(folder, rank),
        )
    except (OSError, CheckpointException) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CheckpointError(f"cannot write checkpoint to {folder}: {reason}") from e


def _read_worker(folder: str, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s worker file (in an object store: that file alone read), or
    ``CheckpointError`` naming it."""
    import io

    from recsys.runtime import storage

    try:
        if not storage.is_uri(folder):
            return dict(torch.load(_worker_file(folder, rank), weights_only=True))
        fs, path = storage.filesystem(_worker_file(folder, rank))
        with fs.open_input_stream(path) as f:
            return dict(torch.load(io.BytesIO(f.read()), weights_only=True))
    except Exception as e:
        raise CheckpointError(f"{folder}: worker_{rank}.pt unreadable ({e})") from None


def saved_world_size(folder: str) -> int:
    """How many workers wrote the checkpoint in ``folder`` (a folder or an object store URI),
    from rank 0's worker file."""
    return int(_read_worker(folder, 0).get("world_size", 0))


def verify(folder: str) -> None:
    """Raise ``CheckpointError`` naming what is wrong unless ``folder`` is a complete checkpoint:
    metadata readable, every shard file at least as long as the metadata says, the worker file of
    every rank that saved it loadable and agreeing on their number. Every rank reaches the same
    verdict from the same files."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    try:
        metadata = FileSystemReader(folder).read_metadata()
    except Exception as e:
        raise CheckpointError(f"{folder}: unreadable .metadata ({e})") from None
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(
            needed.get(info.relative_path, 0), info.offset + info.length
        )
    for name, size in sorted(needed.items()):
        path = os.path.join(folder, name)
        have = os.path.getsize(path) if os.path.isfile(path) else -1
        if have < size:
            what = "is missing" if have < 0 else f"is truncated ({have} of {size} bytes)"
            raise CheckpointError(f"{folder}: shard {name} {what}")
    saved = saved_world_size(folder)
    if saved < 1:
        raise CheckpointError(f"{folder}: worker_0.pt names no number of workers ({saved})")
    for rank in range(1, saved):
        said = _read_worker(folder, rank).get("world_size")
        if said != saved:
            raise CheckpointError(
                f"{folder}: worker_{rank}.pt says {said} workers saved it, worker_0.pt says {saved}"
            )


def load(
    folder: str,
    model: nn.Module,
    optimizer: Any,
    rank: int,
    device: torch.device = CPU,
) -> TrainState:
    """Restore model, optimizer and this rank's state in place (collective), whatever the number
    of workers that saved it (the module docstring has the rule). Callers run ``verify`` first
    and agree on the verdict across ranks (``recsys.train.resume.restore``)."""
    saved = saved_world_size(folder)
    extra = _read_worker(folder, min(rank, saved - 1))
    init_lazy_state(optimizer)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    if not has_optimizer_state(folder):  # stateless optimizers (SGD): DCP wrote no "optim"
        del state["optim"]
    remaps = load_state(folder, state)
    model.load_state_dict(state["model"])
    if "optim" in state:
        optimizer.load_state_dict(state["optim"])
    if hasattr(optimizer, "set_optimizer_step"):  # FBGEMM's step counter (Adam's bias correction)
        optimizer.set_optimizer_step(int(extra["step"]))
        for tbe in step_counter_modules(model):  # what its kernels read, set alike
            tbe.iter_cpu = getattr(tbe, "iter").detach().cpu().clone()  # noqa: B009 (a buffer)
    if rank < saved:
        set_rng_states(extra, device, rank)
    else:
        seed_new_rank(int(extra["step"]), rank, device)
    return TrainState(
        step=int(extra["step"]),
        data_position=int(extra["data_position"]),
        best=float(extra.get("best", float("nan"))),
        best_step=int(extra.get("best_step", 0)),
        stale=int(extra.get("stale", 0)),
        shard_rows=int(extra.get("shard_rows", 0)),
        saved_world_size=saved,
        wall_s=float(extra.get("wall_s", 0.0)),
        worker_s=float(extra.get("worker_s", 0.0)),
        samples_seen=int(extra.get("samples_seen", 0)),
        remapped=tuple(r.describe() for r in remaps),
    )


def step_counter_modules(model: nn.Module) -> list[nn.Module]:
    """Every FBGEMM training TBE in ``model``: the modules with an optimizer step counter
    (``iter``, what ``set_optimizer_step`` sets and checkpoints hold, and ``iter_cpu``, what its
    kernels read). TorchRec's sharded modules keep their lookups, and so their TBEs, in a plain
    list (``_lookups``) that ``nn.Module.modules`` does not enter: this walks into it."""
    found: list[nn.Module] = []
    seen: set[int] = set()
    todo: list[nn.Module] = [model]
    while todo:
        for m in todo.pop().modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            lookups = getattr(m, "_lookups", None)
            if isinstance(lookups, (list, tuple)):
                todo += [x for x in lookups if isinstance(x, nn.Module)]
            it, it_cpu = getattr(m, "iter", None), getattr(m, "iter_cpu", None)
            if isinstance(it, torch.Tensor) and isinstance(it_cpu, torch.Tensor):
                found.append(m)
    return found


def load_state(folder: str, state: dict[str, Any]) -> list[rowwise_state.Remap]:
    """``dcp.load`` into ``state`` (collective), mapping the row-wise optimizer states whose
    layout the loading plan changed (``rowwise_state``); returns those. A state the checkpoint
    lacks or cannot map raises ``CheckpointError`` naming it, before anything is loaded."""
    metadata = FileSystemReader(folder).read_metadata()
    flat = rowwise_state.flatten(state)
    missing = sorted(k for k in flat if k not in metadata.state_dict_metadata)
    if missing:
        raise CheckpointError(
            f"{folder} has no {missing[0]} ({len(missing)} missing): it was saved by another "
            "model or another optimizer, or with this table data-parallel in one run and sharded "
            "in the other; resume with the saving run's config"
        )
    try:
        remaps = rowwise_state.plan_remaps(metadata, flat)
    except rowwise_state.LayoutError as e:
        raise CheckpointError(f"{folder}: {e}") from None
    targets = {}
    for r in remaps:  # read whole in the saved layout, then mapped into this plan's shards
        holder, name = flat[r.key]
        saved: Any = metadata.state_dict_metadata[r.key]  # a tensor's (plan_remaps found it)
        targets[r.key] = holder[name]
        holder[name] = torch.empty(tuple(saved.size), dtype=saved.properties.dtype)
    dcp.load(state, checkpoint_id=folder)
    for r in remaps:
        holder, name = flat[r.key]
        rowwise_state.fill(targets[r.key], rowwise_state.mapped(r, holder[name]))
        holder[name] = targets[r.key]
    return remaps


def warm_start(folder: str, model: nn.Module, optimizer: Any) -> list[str]:
    """Start a new run from another run's checkpoint in ``folder`` (collective): its weights and
    optimizer state, resharded to this plan as a resume is; where a table grew (a vocabulary
    grown since: ``recsys-preprocess --like --grow-vocab``), its saved rows and their 2-d
    optimizer state (Adam's moments) are copied into the first rows and the new rows keep their
    initial values and a fresh state, as does a grown table's row-wise (1-d) state. The step
    counter of FBGEMM's Adam goes on from the saved step (its bias correction), the run's own
    step, data position and scores start afresh. Returns notes on what was not carried over
    ('' for nothing); a state of another shape than a grown table's is refused naming it."""
    init_lazy_state(optimizer)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    if not has_optimizer_state(folder):
        del state["optim"]
    saved_md = FileSystemReader(folder).read_metadata().state_dict_metadata
    flat = rowwise_state.flatten(state)
    grown: dict[str, tuple[dict[str, Any], str, Any]] = {}
    fresh: dict[str, tuple[dict[str, Any], str, Any]] = {}
    for key, (holder, name) in flat.items():
        now, saved = holder[name], saved_md.get(key)
        if saved is None:
            other = sorted(k for k in saved_md if k.startswith("model.") and k not in flat)
            more = f" and {len(other) - 3} more" if len(other) > 3 else ""
            held = f" (it has {', '.join(other[:3])}{more})" if other else ""
            raise CheckpointError(f"{folder} has no {key}: it was saved by another model{held}")
        if not isinstance(saved, TensorStorageMetadata):  # (bytes: an object's pickle)
            continue
        if not hasattr(now, "size") or tuple(now.size()) == tuple(saved.size):
            continue
        size, before = tuple(now.size()), tuple(saved.size)
        if len(before) != len(size) or before[0] >= size[0] or before[1:] != size[1:]:
            raise CheckpointError(f"{folder}: {key} was saved {before}, is {size} now: only a "
                                  "table's rows may grow between runs")  # fmt: skip
        fresh_state = key.startswith("optim.") and len(size) == 1  # row-wise, maybe columns
        (fresh if fresh_state else grown)[key] = (holder, name, now)
        holder[name] = torch.empty(before, dtype=saved.properties.dtype)  # read whole
    dcp.load(state, checkpoint_id=folder)
    for _key, (holder, name, now) in grown.items():
        _copy_rows(now, holder[name])
        holder[name] = now
    for _key, (holder, name, now) in fresh.items():
        holder[name] = now
    model.load_state_dict(state["model"])
    if "optim" in state:
        optimizer.load_state_dict(state["optim"])
    if hasattr(optimizer, "set_optimizer_step"):
        optimizer.set_optimizer_step(int(_read_worker(folder, 0)["step"]))
        for tbe in step_counter_modules(model):
            tbe.iter_cpu = getattr(tbe, "iter").detach().cpu().clone()  # noqa: B009 (a buffer)
    tables = sorted({k.split(".")[-2] for k in grown if k.startswith("model.")})
    notes = [f"{t}: its saved rows copied, its new rows initialised" for t in tables]
    notes += [f"{k}: a fresh state (a grown table's row-wise state)" for k in sorted(fresh)]
    return notes


def _copy_rows(target: Any, saved: torch.Tensor) -> None:
    """``saved``'s rows into the first rows of ``target`` (a plain tensor, or this rank's local
    shards of a ``ShardedTensor``, each at its offsets)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        if not isinstance(target, ShardedTensor):
            target[: saved.shape[0]].copy_(saved)
            return
        for shard in target.local_shards():
            offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            r0, n = offsets[0], max(0, min(sizes[0], saved.shape[0] - offsets[0]))
            if n:
                cols = tuple(slice(o, o + s) for o, s in zip(offsets[1:], sizes[1:], strict=True))
                shard.tensor[:n].copy_(saved[(slice(r0, r0 + n), *cols)])


def seed_new_rank(step: int, rank: int, device: torch.device) -> None:
    """The generators of a rank that the saving run did not have: seeded from step and rank, so
    they repeat no saved rank's stream and a second resume the same way draws the same."""
    torch.manual_seed(new_rank_seed(step, rank))
    if device.type == "cuda":
        torch.cuda.manual_seed(new_rank_seed(step, rank))


def new_rank_seed(step: int, rank: int) -> int:
    return 1_000_003 * step + rank


def has_optimizer_state(folder: str) -> bool:
    """Whether the checkpoint holds optimizer state (an SGD run's has none at all)."""
    keys = FileSystemReader(folder).read_metadata().state_dict_metadata
    return any(k == "optim" or k.startswith("optim.") for k in keys)


def init_lazy_state(optimizer: Any) -> None:
    """Create the state a dense optimizer makes lazily (``torch.optim.Adam`` at its first step)
    with TorchRec's ``init_state`` (a step on zero gradients), so a checkpoint's state has a place
    to load into: ``KeyedOptimizer.load_state_dict`` skips parameters without state, and a
    restored Adam would otherwise start from nothing. The parameters are loaded afterwards, so
    the dummy step leaves no trace. The fused embedding optimizers keep their state from the
    start; only their step counter lives outside it (``set_optimizer_step`` in ``load``)."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    for _, opt in getattr(optimizer, "optimizers", []):
        if isinstance(opt, KeyedOptimizerWrapper):
            opt.init_state()


def load_model_unsharded(folder: str, model: nn.Module) -> nn.Module:
    """Load a sharded checkpoint's model weights into an unsharded model (any process, no
    process group): DCP reassembles each table from its shards."""
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    model.load_state_dict(state["model"])
    return model

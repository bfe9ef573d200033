"""Data at scale, on small files: a prepared folder's splits as memory-mapped shards, per-rank
row ranges across shard and file boundaries, vocabularies and serving with them, TorchRec's own
folders, line counts of byte ranges."""

from __future__ import annotations

import collections
import random

import numpy as np
import pandas as pd
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import DataConfig, ExperimentConfig, SparseLayout, SyntheticConfig
from recsys.data import shard_range
from recsys.data.columns import Concat
from recsys.data.dataset import resolve
from recsys.data.input.loader import TrainStream, load_splits
from recsys.data.input.permutation import Permutation
from recsys.data.input.synthetic import generate, transform_dense
from recsys.data.prepared.folder import PreparedShard
from recsys.data.prepared.meta import read_meta
from recsys.data.prepared.torchrec_npy import load_folder
from recsys.data.schema import DatasetSchema
from recsys.prepare.pipeline import prepare


class Echo(torch.nn.Module):
    """Returns the first feature's id of each row as its logit."""

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return sparse.values().view(26, -1)[0].float().unsqueeze(1)


ROWS = [1000] * 26
LAYOUT = SparseLayout([f"cat_{i}" for i in range(26)], ROWS)


def days_folder(tmp_path, sizes=(300, 170, 230), min_count=1, val=0.1, test=0.1):
    """A prepared folder of one generated Criteo day per size (split by order, small pieces:
    several shards per split), and the generated rows of all days in order."""
    paths, data = [], []
    for k, n in enumerate(sizes):
        path = tmp_path / f"day_{k}.txt"
        data.append(generate(SyntheticConfig(num_samples=n, seed=10 + k), 13, ROWS))
        data[-1].write_tsv(str(path))
        paths.append(str(path))
    schema = DatasetSchema.load("criteo_kaggle").to_dict()
    schema["split"] = {"by": "order", "val_fraction": val, "test_fraction": test}
    for spec in schema["sparse"].values():
        spec["min_count"] = min_count
    out = str(tmp_path / "prepared")
    prepare(DatasetSchema.from_dict(schema), paths, out, workers=0, chunk_mb=0.02,
            log=lambda s: None)  # fmt: skip
    dense = np.concatenate([np.nan_to_num(d.dense_raw, nan=0.0) for d in data])
    raw = np.concatenate([d.sparse[:, :, 0] for d in data])
    return out, transform_dense(dense), raw


def prepared_cfg(folder: str) -> DataConfig:
    return DataConfig(source="prepared", paths=[folder])


def test_rank_ranges_across_shard_and_file_boundaries_stay_memory_mapped(tmp_path):
    folder, ref_dense, _ = days_folder(tmp_path)
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}}))
    splits = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings)
    train = splits.train
    assert isinstance(train, Concat) and len(train.parts) > 3  # shards of several pieces
    for shard in train.parts:  # nothing was concatenated or loaded: the shards stay mapped
        assert isinstance(shard, PreparedShard)
        assert all(isinstance(a, np.memmap) for a in (shard.dense, shard.labels))
    n = len(train)
    assert n == 700 - 70 - 70
    ids = np.concatenate([np.stack(p.read(0, len(p)).values, 1) for p in train.parts])
    for world in (1, 2, 3, 4):
        for rank in range(world):
            a, b = shard_range(n, rank, world)
            got = train.slice(a, b).read(0, b - a)  # crosses shard boundaries for most ranks
            np.testing.assert_allclose(got.dense, ref_dense[a:b], rtol=1e-6)
            np.testing.assert_array_equal(np.stack(got.values, 1), ids[a:b])
            idx = np.array([b - a - 1, 0, (b - a) // 2])  # any order, across shards
            picked = train.slice(a, b).take(idx)
            np.testing.assert_array_equal(np.stack(picked.values, 1), ids[a + idx])


def test_shuffled_stream_covers_its_rows_once_per_epoch_across_shards(tmp_path):
    folder, ref_dense, _ = days_folder(tmp_path, val=0.0, test=0.0)
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}}))
    train = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings).train
    layout = cfg.embeddings.layout()
    ref = ref_dense[:, 0]
    for rank in range(2):
        s = TrainStream(
            train, rank=rank, world_size=2, batch_size=50, layout=layout, seed=1, shuffle=True
        )
        a, b = shard_range(len(train), rank, 2)
        first = np.concatenate([s.next_indices() for _ in range(7)])  # 350 = one epoch of 350
        assert sorted(first.tolist()) == list(range(b - a))
        rows = s.shard.take(first[:20]).dense[:, 0]
        np.testing.assert_allclose(rows, ref[a + first[:20]], rtol=1e-6)
        second = np.concatenate([s.next_indices() for _ in range(7)])
        assert sorted(second.tolist()) == list(range(b - a)) and not np.array_equal(first, second)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_permutation_is_a_seeded_bijection(n):
    img = Permutation(n, key=(0, 1, 2))(np.arange(n))
    assert sorted(img.tolist()) == list(range(n))
    again = Permutation(n, key=(0, 1, 2))(np.arange(n))
    np.testing.assert_array_equal(img, again)
    if n > 50:
        other = Permutation(n, key=(0, 2, 2))(np.arange(n))
        assert (img != other).mean() > 0.9


def test_vocabulary_counts_ids_and_table_sizes(tmp_path):
    folder, _, raw = days_folder(tmp_path, sizes=(400, 300), min_count=3, val=0.0, test=0.0)
    cfg = resolve(ExperimentConfig.from_dict({"data": {"source": "prepared", "paths": [folder]}}))
    meta = read_meta(folder)
    assert cfg.embeddings.num_embeddings == meta["table_sizes"]
    train = load_splits(cfg.data, 13, cfg.embeddings.num_embeddings).train
    ids = np.stack(train.read(0, len(train)).values, 1)
    for f, name in enumerate(meta["feature_names"]):
        counter = collections.Counter(int(v) for v in raw[:, f])
        kept = [v for v, c in counter.items() if c >= 3]
        hashes = dict(zip(kept, hash_of(kept).tolist(), strict=True))
        order = sorted(kept, key=lambda v: (-counter[v], hashes[v]))  # ties: by hash
        vocab = np.load(f"{folder}/{meta['vocab'][name]}")
        assert vocab.tolist() == [hashes[v] for v in order]  # descending frequency
        assert meta["table_sizes"][f] == len(kept) + 2  # row 0 missing, row 1 unseen
        expected = [order.index(int(v)) + 2 if int(v) in hashes else 1 for v in raw[:, f]]
        assert ids[:, f].tolist() == expected  # rare ids share the OOV row


def hash_of(values) -> np.ndarray:
    return pd.util.hash_array(np.asarray(values, np.int64), categorize=False).astype(np.uint64)


def test_serving_maps_raw_rows_with_the_training_vocabulary(tmp_path):
    """The served model turns Criteo rows into ids with the vocabulary the model was trained
    on: an echo model returns the first feature's id it receives as its logit."""
    import json

    from recsys.data.dataset import write_serving
    from recsys.serving.scorer import TabularScorer

    rows = "".join(
        "\t".join(["0", *["1"] * 13, h, *["00000001"] * 25]) + "\n"
        for h in ["0000ffff"] * 3 + ["000000ab"] * 2 + ["12345678"]
    )
    (tmp_path / "t.txt").write_text(rows)
    schema = DatasetSchema.load("criteo_kaggle").to_dict()
    schema["split"] = {"by": "order", "val_fraction": 0.0, "test_fraction": 0.0}
    schema["sparse"]["C1"]["min_count"] = 2
    prepare(DatasetSchema.from_dict(schema), [str(tmp_path / "t.txt")], str(tmp_path / "p"),
            workers=0, log=lambda s: None)  # fmt: skip
    cfg = resolve(ExperimentConfig.from_dict({"data": prepared_cfg(str(tmp_path / "p")).__dict__}))
    write_serving(cfg, str(tmp_path / "export" / "prepared"))
    torch.jit.save(torch.jit.script(Echo()), str(tmp_path / "model.pt"))
    meta = {"table_rows": [10**6] * 26}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    scorer = TabularScorer()
    files = {"model": "model.pt", "meta": "meta.json", "prepared": "export/prepared"}
    ctx = type("Ctx", (), {"artifacts": {k: str(tmp_path / v) for k, v in files.items()}})
    scorer.load_context(ctx)
    frame = pd.DataFrame({f"I{k}": [1, 2, 3, 4] for k in range(1, 14)})
    for k in range(1, 27):
        frame[f"C{k}"] = ["0000FFFF", "ab", "12345678", ""]  # kept, kept, rare, missing
    probs = scorer.predict(None, frame)["label"].to_numpy()
    ids = np.rint(np.log(probs / (1 - probs))).astype(int)
    assert ids.tolist() == [2, 3, 1, 0]  # by descending count: ffff (3), ab (2); unseen 1


def test_torchrec_made_folder_is_read_with_its_own_transform(tmp_path):
    """A folder written by TorchRec's own ``tsv_to_npys`` (dense = log(x - min + 2), min per file,
    not recorded) reads as the same features as our preprocessing of the same text."""
    from torchrec.datasets.criteo import BinaryCriteoUtils

    folder = tmp_path / "torchrec"
    folder.mkdir()
    texts, minima = [], []
    for k in range(2):
        text = tmp_path / f"day_{k}"
        data = generate(SyntheticConfig(num_samples=600, seed=k), 13, ROWS)
        data.write_tsv(str(text))
        minima.append(int(np.nan_to_num(data.dense_raw, nan=0).min()))
        out = {p: str(folder / f"day_{k}_{p}.npy") for p in ("dense", "sparse", "labels")}
        BinaryCriteoUtils.tsv_to_npys(str(text), out["dense"], out["sparse"], out["labels"])
        texts.append(data.columns())
    days = load_folder(str(folder))
    # each file has its own min (here -3 and -2: TorchRec's offset differs per day), read off it
    assert [d.transform.min for d in days] == minima and len(set(minima)) == 2
    for day, ref in zip(days, texts, strict=True):
        got = day.read(0, len(day))
        assert (ref.dense > 0).mean() > 0.5  # non-zero dense values, not only missing ones
        np.testing.assert_allclose(got.dense, ref.dense, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(got.sparse, ref.sparse.astype(np.int64))
    declared = load_folder(str(folder), torchrec_dense_min=minima[0])
    np.testing.assert_array_equal(declared[0].read(0, 50).dense, days[0].read(0, 50).dense)


def test_line_count_of_byte_ranges_across_read_blocks(tmp_path):
    """Line counts over byte ranges larger than the 4 MiB read buffer: every newline once, and
    a last line without a newline counted."""
    from recsys.prepare.sources import COUNT_BYTES, _count_lines

    rng = random.Random(0)
    data = b"".join(b"x" * rng.randint(0, 300) + b"\n" for _ in range(60_000)) + b"tail"
    assert len(data) > 2 * COUNT_BYTES
    path = tmp_path / "day.tsv"
    path.write_bytes(data)
    assert _count_lines(str(path), 0, len(data)) == data.count(b"\n") + 1
    stop = len(data) - 4
    assert _count_lines(str(path), 7, stop) == data[7:stop].count(b"\n")

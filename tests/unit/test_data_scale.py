"""Data at scale, on small files: memory-mapped splits over several days, per-rank row ranges
across file boundaries, the vectorised parser against the reference one, vocabularies, TorchRec's
own folders."""

from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import (
    ConfigError,
    DataConfig,
    ExperimentConfig,
    SparseLayout,
    SyntheticConfig,
)
from recsys.data import TrainStream, load_splits, shard_range
from recsys.data import vocab as vocab_lib
from recsys.data.binary import NpyDay, load_folder
from recsys.data.columns import Concat, RowRange
from recsys.data.criteo import ReadStats, parse_lines, parse_row, read_tsv, transform_dense
from recsys.data.permutation import Permutation
from recsys.data.preprocess import preprocess
from recsys.data.synthetic import generate


class Echo(torch.nn.Module):
    """Returns the first feature's id of each row as its logit."""

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return sparse.values().view(26, -1)[0].float().unsqueeze(1)


ROWS = [1000] * 26
LAYOUT = SparseLayout([f"cat_{i}" for i in range(26)], ROWS)


def days_folder(tmp_path, sizes=(300, 170, 230), vocab_min_count=None):
    """A binary folder with one day per size, from synthetic Criteo text."""
    paths = []
    for k, n in enumerate(sizes):
        path = tmp_path / f"day_{k}.txt"
        generate(SyntheticConfig(num_samples=n, seed=10 + k), 13, ROWS).write_tsv(str(path))
        paths.append(str(path))
    out = str(tmp_path / "npy")
    preprocess(paths, out, "error", progress=False, vocab_min_count=vocab_min_count)
    return out, paths


def test_rank_ranges_across_file_boundaries_stay_memory_mapped(tmp_path):
    folder, paths = days_folder(tmp_path)
    reference = [read_tsv(p) for p in paths]
    ref_dense = np.concatenate([r.dense for r in reference])
    ref_sparse = np.concatenate([r.sparse for r in reference])
    cfg = DataConfig(source="criteo_binary", paths=[folder], val_fraction=0.1, test_fraction=0.1)
    train = load_splits(cfg, 13, ROWS).train
    assert isinstance(train, RowRange) and isinstance(train.base, Concat)
    for day in train.base.parts:  # nothing was concatenated or loaded: the days stay mapped
        assert isinstance(day, NpyDay)
        assert all(isinstance(a, np.memmap) for a in (day.dense, day.sparse, day.labels))
    n = len(train)
    assert n == 700 - 70 - 70
    for world in (1, 2, 3, 4):
        for rank in range(world):
            a, b = shard_range(n, rank, world)
            got = train.slice(a, b).read(0, b - a)  # crosses day boundaries for most ranks
            np.testing.assert_array_equal(got.dense, ref_dense[a:b])
            np.testing.assert_array_equal(got.sparse, ref_sparse[a:b])
            idx = np.array([b - a - 1, 0, (b - a) // 2])  # any order, across files
            np.testing.assert_array_equal(train.slice(a, b).take(idx).sparse, ref_sparse[a + idx])


def test_shuffled_stream_covers_its_rows_once_per_epoch_across_files(tmp_path):
    folder, paths = days_folder(tmp_path)
    cfg = DataConfig(source="criteo_binary", paths=[folder], val_fraction=0.0, test_fraction=0.0)
    train = load_splits(cfg, 13, ROWS).train
    ref = np.concatenate([read_tsv(p).dense[:, 0] for p in paths])
    for rank in range(2):
        s = TrainStream(
            train, rank=rank, world_size=2, batch_size=50, layout=LAYOUT, seed=1, shuffle=True
        )
        a, b = shard_range(len(train), rank, 2)
        first = np.concatenate([s.next_indices() for _ in range(7)])  # 350 = one epoch of 350
        assert sorted(first.tolist()) == list(range(b - a))
        rows = s.shard.take(first[:20]).dense[:, 0]
        np.testing.assert_array_equal(rows, ref[a + first[:20]])
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


def _line(rng, label="0", dense=None, cats=None) -> str:
    dense = dense or [str(rng.randint(-3, 10 ** rng.randint(0, 7))) if rng.random() > 0.2 else ""
                      for _ in range(13)]  # fmt: skip
    cats = cats or [f"{rng.getrandbits(32):08x}" if rng.random() > 0.1 else "" for _ in range(26)]
    return "\t".join([label, *dense, *cats]) + "\n"


def test_vectorised_parser_equals_the_reference_parser():
    rng = random.Random(0)
    odd = [  # forms Python's int() reads that the fast path hands to the reference parser
        _line(rng, dense=["+5", *["1"] * 12]),
        _line(rng, dense=[" 7", *["1"] * 12]),
        _line(rng, dense=["1_000", *["1"] * 12]),
        _line(rng, cats=["0x1f", *["a"] * 25]),
        _line(rng, cats=["ABCDEF12", *["a"] * 25]),
        _line(rng, dense=["-0", *["-12"] * 12]),
        _line(rng).replace("\n", "\r\n"),
        _line(rng, dense=["9" * 18, *["1"] * 12]),
    ]
    lines = [_line(rng, rng.choice("01")) for _ in range(2000)] + odd
    rng.shuffle(lines)
    parsed = parse_lines("".join(lines).encode(), path="x", first_line=1, on_bad_row="error",
                         stats=ReadStats())  # fmt: skip
    ref = [parse_row(line, 13, 26) for line in lines]
    np.testing.assert_array_equal(parsed.labels[:, 0], [r[0] for r in ref])
    np.testing.assert_array_equal(parsed.sparse, np.array([r[2] for r in ref], np.uint32))
    np.testing.assert_array_equal(
        parsed.dense, transform_dense(np.array([r[1] for r in ref], np.int64))
    )


def test_vectorised_parser_names_the_first_bad_line_or_skips_and_counts():
    rng = random.Random(1)
    bad = [
        _line(rng, dense=["x", *["1"] * 12]),
        "\n",
        _line(rng, label="2"),
        _line(rng, dense=["9" * 30, *["1"] * 12]),
    ]
    lines = [_line(rng) for _ in range(50)] + [bad[0]] + [_line(rng) for _ in range(9)] + bad[1:]
    buf = "".join(lines).encode()
    stats = ReadStats()
    kept = parse_lines(buf, path="f.txt", first_line=10, on_bad_row="skip", stats=stats)
    assert len(kept) == 59 and stats.skipped == 4
    assert stats.examples[0].startswith("f.txt:60: integer feature I1 is not an integer")
    with pytest.raises(Exception, match=r"f\.txt:60: integer feature I1 is not an integer: 'x'"):
        parse_lines(buf, path="f.txt", first_line=10, on_bad_row="error", stats=ReadStats())
    with pytest.raises(Exception, match="out of the 64-bit range"):
        parse_row(bad[3], 13, 26)


def test_vocabulary_counts_ids_and_table_sizes(tmp_path):
    folder, paths = days_folder(tmp_path, sizes=(400, 300), vocab_min_count=3)
    raw = np.concatenate([read_tsv(p).sparse[:, :, 0] for p in paths])
    meta = json.loads((tmp_path / "npy" / "meta.json").read_text())
    assert meta["sparse"] == "vocab" and meta["vocab"]["min_count"] == 3
    vocabs = vocab_lib.load(folder, meta["vocab"]["files"])
    ids = np.concatenate([d.read(0, len(d)).sparse[:, :, 0] for d in load_folder(folder)])
    for f in range(26):
        counter = collections.Counter(int(v) for v in raw[:, f] if v != 0)  # 0 = missing
        kept = sorted((v for v, c in counter.items() if c >= 3), key=lambda v: (-counter[v], v))
        assert vocabs[f].kept.tolist() == kept  # descending frequency, ties by value
        assert meta["vocab"]["table_sizes"][f] == len(kept) + 1
        expected = [kept.index(int(v)) + 1 if int(v) in kept else 0 for v in raw[:, f]]
        assert ids[:, f].tolist() == expected  # rare and missing share id 0
    cfg = ExperimentConfig.from_dict(
        {
            "data": {"source": "criteo_binary", "paths": [folder]},
            "embeddings": {"num_embeddings": "from_data"},
        }
    )
    assert cfg.embeddings.num_embeddings == meta["vocab"]["table_sizes"]
    (tmp_path / "h").mkdir()
    hashed, _ = days_folder(tmp_path / "h", sizes=(50,))  # no --vocab-min-count: hashes
    with pytest.raises(ConfigError, match="has no vocabulary"):
        ExperimentConfig.from_dict(
            {
                "data": {"source": "criteo_binary", "paths": [hashed]},
                "embeddings": {"num_embeddings": "from_data"},
            }
        )


def test_serving_maps_raw_rows_with_the_training_vocabulary(tmp_path):
    """CriteoScorer turns Criteo rows into ids with the vocabulary the model was trained on:
    an echo model returns the first feature's id it receives as its logit."""
    import pandas as pd

    from recsys.serving import CriteoScorer, columns

    kept = np.array([0xAB, 0x10, 0xFFFF], np.uint32)
    vocab_lib.save(str(tmp_path), [kept] + [np.zeros(0, np.uint32)] * 25)
    torch.jit.save(torch.jit.script(Echo()), str(tmp_path / "model.pt"))
    meta = {
        "num_dense": 13,
        "feature_names": LAYOUT.names,
        "table_rows": [10**6] * 26,
        "dense_transform": "log1p",
        "vocab": [vocab_lib.file_name(f) for f in range(26)],
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    scorer = CriteoScorer()
    ctx = type("Ctx", (), {"artifacts": {"model": str(tmp_path / "model.pt"),
                                         "meta": str(tmp_path / "meta.json")}})  # fmt: skip
    scorer.load_context(ctx)
    dense_cols, sparse_cols = columns(13, 26)
    rows = pd.DataFrame({c: [1, 2, 3, 4] for c in dense_cols})
    for c in sparse_cols:
        rows[c] = ["0000ffff", "000000ab", "12345678", ""]  # kept, kept, rare, missing
    probs = scorer.predict(None, rows)
    ids = np.rint(np.log(probs / (1 - probs))).astype(int)
    assert ids.tolist() == [3, 1, 0, 0]


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
        texts.append(read_tsv(str(text)))
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
    """count_lines over chunks larger than its 4 MiB read buffer: every newline once, and a
    last line without a newline counted."""
    from recsys.data.criteo import BLOCK_BYTES
    from recsys.data.preprocess import Chunk, count_lines

    rng = random.Random(0)
    data = b"".join(b"x" * rng.randint(0, 300) + b"\n" for _ in range(60_000)) + b"tail"
    assert len(data) > 2 * BLOCK_BYTES
    path = tmp_path / "day.tsv"
    path.write_bytes(data)
    assert count_lines(Chunk(0, str(path), 0, None, False)) == data.count(b"\n") + 1
    stop = len(data) - 4
    assert count_lines(Chunk(0, str(path), 7, stop, False)) == data[7:stop].count(b"\n")

"""Preprocessing as Ray tasks (2 worker processes, files cut into several chunks) gives the same
bytes as the single-process path; errors still name the file and line."""

from __future__ import annotations

import filecmp
import os

import pytest

from recsys.config import SyntheticConfig
from recsys.data import DataError
from recsys.data.preprocess import plan_chunks, preprocess
from recsys.data.synthetic import generate

pytestmark = pytest.mark.ray
CHUNK_MB = 0.02  # ~140 rows per chunk: every plain input is cut into several


def inputs(tmp_path, bad: dict[int, list[int]] | None = None) -> list[str]:
    """Two plain files and a gzip one (600 rows each); ``bad``: file -> lines to break."""
    paths = []
    for k in range(3):
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = str(tmp_path / (f"day_{k}" + (".gz" if k == 2 else "")))
        data = generate(SyntheticConfig(num_samples=600, seed=k), 13, [500] * 26)
        data.write_tsv(path, compress=k == 2)
        if bad and k in bad:
            with open(path) as f:
                lines = f.readlines()
            for line in bad[k]:
                lines[line - 1] = lines[line - 1].replace("\t", "\tx", 1)  # a non-integer I1
            with open(path, "w") as f:
                f.writelines(lines)
        paths.append(path)
    return paths


def same_tree(a: str, b: str) -> list[str]:
    """Files that differ (by content) or exist on one side only."""
    cmp = filecmp.dircmp(a, b)
    out = cmp.left_only + cmp.right_only + cmp.diff_files + cmp.funny_files
    for name in cmp.common_files:
        if not filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False):
            out.append(name)
    for sub in cmp.common_dirs:
        out += [f"{sub}/{x}" for x in same_tree(os.path.join(a, sub), os.path.join(b, sub))]
    return out


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_parallel_output_equals_single_process_byte_for_byte(ray_2_cpus, tmp_path, on_bad_row):
    bad = {0: [2, 290], 1: [599]} if on_bad_row == "skip" else None
    paths = inputs(tmp_path, bad)
    chunks = plan_chunks(paths, int(CHUNK_MB * 2**20))
    assert len([c for c in chunks if c.day == 0]) >= 3 and len(chunks) >= 7
    single, parallel = str(tmp_path / "single"), str(tmp_path / "parallel")
    kw = {"progress": False, "vocab_min_count": 2}
    rows_1 = preprocess(paths, single, on_bad_row, workers=0, **kw)
    rows_2 = preprocess(paths, parallel, on_bad_row, workers=2, chunk_mb=CHUNK_MB, **kw)
    assert rows_1 == rows_2 == ([598, 599, 600] if bad else [600, 600, 600])
    assert os.path.isdir(os.path.join(single, "vocab"))
    assert same_tree(single, parallel) == []


def test_bad_row_in_the_third_chunk_of_the_second_file_names_file_and_line(ray_2_cpus, tmp_path):
    probe = inputs(tmp_path / "probe")
    second = [c for c in plan_chunks(probe, int(CHUNK_MB * 2**20)) if c.day == 1]
    with open(probe[1], "rb") as f:
        line = f.read(second[2].start).count(b"\n") + 5  # the fifth line of the third chunk
    paths = inputs(tmp_path, {1: [line]})
    with pytest.raises(DataError, match=rf"day_1:{line}: integer feature I1 is not an integer"):
        preprocess(paths, str(tmp_path / "out"), "error", False, workers=2, chunk_mb=CHUNK_MB)

"""The GPU throughput harness (``benchmarks/gpu_throughput.py``) run whole on CPU at a tiny shape
(gloo, FBGEMM's CPU kernels), in its own process as gpu-check runs it; its cap and its verdict."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

from benchmarks.gpu_throughput import (
    GOAL,
    KAGGLE,
    TABLE_SHARE,
    TINY,
    Result,
    Side,
    cap_rows,
    table_bytes,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "benchmarks.gpu_throughput", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_harness_trains_both_models_on_cpu_and_writes_its_figures(tmp_path):
    out = harness("--tiny", "--device", "cpu", "--warmup", "2", "--steps", "2", "--reps", "2",
                  "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    fig = json.loads((tmp_path / "gpu-throughput.json").read_text())
    assert fig["shape"]["tables"] == [1000] * 4 and fig["shape"]["dim"] == 16
    assert (fig["device"], fig["steps"], fig["reps"], fig["warmup"]) == ("cpu", 2, 2, 2)
    for side in ("ours", "torchrec"):
        s = fig[side]
        assert len(s["runs"]) == 2 and all(r > 0 for r in s["runs"]), s
        assert min(s["runs"]) <= s["samples_per_s"] <= max(s["runs"])
        assert math.isfinite(s["loss_first"]) and math.isfinite(s["loss_last"]), s
        assert s["dense_change"] > 0 and s["table_change"] > 0, s  # both trained
        assert s["plan"] == {"table_wise/fused": 4}, s  # the same plan, every table fused
    assert fig["trained"] == {"ours": True, "torchrec": True}
    assert fig["ratio"] == fig["ours"]["samples_per_s"] / fig["torchrec"]["samples_per_s"]
    assert fig["goal"] == GOAL and fig["goal_met"] == (fig["ratio"] >= GOAL)
    assert set(fig["machine"]) == {"device", "torch", "torchrec", "fbgemm_gpu", "date", "commit"}
    assert fig["machine"]["commit"].startswith("commit ")
    verdict = out.stdout.strip().splitlines()[-1]
    assert verdict == fig["verdict"] and f"{fig['ratio']:.2f}x" in verdict
    md = (tmp_path / "gpu-throughput.md").read_text()
    assert md.startswith("## gpu throughput") and verdict in md
    assert "| config | ours samples/s |" in md and "| tiny |" in md


def test_asking_for_a_gpu_where_there_is_none_says_so():
    out = harness("--tiny", "--device", "cuda")
    assert out.returncode == 2 and "torch sees no GPU" in out.stderr


def test_the_kaggle_tables_are_capped_only_where_they_do_not_fit():
    rows, dim = KAGGLE.rows, KAGGLE.dim
    assert len(rows) == 26 and dim == 128 and KAGGLE.batch == 16384
    h200 = int(TABLE_SHARE * 139.8 * 2**30)
    assert table_bytes(rows, dim) < h200 and cap_rows(rows, dim, h200) is None
    a100_40 = int(TABLE_SHARE * 39.4 * 2**30)
    cap = cap_rows(rows, dim, a100_40)
    assert cap is not None
    assert table_bytes((min(r, cap) for r in rows), dim) <= a100_40
    assert table_bytes((min(r, cap + 1) for r in rows), dim) > a100_40  # the largest that fits
    capped = replace(KAGGLE, cap=cap)
    assert capped.tables == [r if r <= cap else cap for r in rows]
    big = sum(r > cap for r in rows)
    assert 0 < big < 26 and f"{big} capped at {cap:,} rows" in capped.text()
    assert "none capped" in TINY.text()


def side(samples: float, dense_change: float = 0.1, loss: float = 0.5) -> Side:
    return Side(samples, 0.0, [samples], 0.7, loss, dense_change, 0.1, {"table_wise/fused": 26})


def result(ours: Side, torchrec: Side) -> Result:
    return Result({"name": "x", "text": "x"}, "cuda:0", 1, 1, 1, True, ours, torchrec, None)


def test_the_verdict_is_computed_from_the_figures():
    assert result(side(95.0), side(100.0)).verdict() == (
        f"ours / TorchRec's DLRM samples/s: 0.95x (goal >= {GOAL}: met); both trained"
    )
    missed = result(side(85.0), side(100.0))
    assert not missed.goal_met and "0.85x" in missed.verdict() and "missed" in missed.verdict()
    untrained = result(side(100.0), side(100.0, dense_change=0.0))
    assert untrained.verdict().endswith("NOT TRAINED: TorchRec's")
    assert not result(side(100.0, loss=math.nan), side(1.0)).ours.trained

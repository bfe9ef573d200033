"""Writing a prepared folder's shards: each task appends its piece's encoded rows to the npy files
of its own shard (``<split>/part-<k>.<suffix>.npy``), the row count written into the header when
the shard is closed. ``recsys.data.prepared.folder`` reads them back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recsys.data.schema import DatasetSchema
from recsys.prepare.encode import Encoded

HEADER_BYTES = 256  # fixed npy header length, so the row count can be written at the end


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 npy header padded to ``HEADER_BYTES`` (the same length for any shape)."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(d).encode("latin1")
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f"npy header for {shape} longer than {HEADER_BYTES} bytes")
    body = text + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class NpyAppender:
    """An npy file written in pieces: rows are appended, the shape written on ``close``."""

    def __init__(self, path: str, dtype: str, width: int | None) -> None:
        self.path, self.dtype, self.width = path, np.dtype(dtype), width
        self.rows = 0
        self.f = open(path, "wb")  # noqa: SIM115 (closed in close)
        self.f.write(b"\0" * HEADER_BYTES)

    def append(self, array: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(array, dtype=self.dtype).tobytes())
        self.rows += len(array)

    def close(self) -> None:
        shape = (self.rows,) if self.width is None else (self.rows, self.width)
        self.f.seek(0)
        self.f.write(npy_header(self.dtype, shape))
        self.f.close()


def shard_files(schema: DatasetSchema) -> dict[str, tuple[str, int | None]]:
    """A shard's files by suffix, with dtype and width (``None``: one-dimensional): ``dense``
    ``[N, I]``, ``labels`` ``[N, L]``, ``ids`` ``[N, F1]`` (the one-hot features, in schema
    order), and per multi-hot feature ``j`` (its place among all sparse features)
    ``list_{j}.values`` ``[nnz]`` and ``list_{j}.offsets`` ``[N + 1]``, with
    ``list_{j}.weights`` ``[nnz]`` float32 for a weighted list; with ``group_by``, ``groups``
    ``[N]`` int64 (each row's group hash, ``recsys.prepare.encode.group_hashes``)."""
    one_hot = [n for n, c in schema.sparse.items() if not c.multi_hot]
    out: dict[str, tuple[str, int | None]] = {
        "dense": ("<f4", len(schema.dense)),
        "labels": ("i1", len(schema.labels)),
        "ids": ("<u4", len(one_hot)),
    }
    for j, spec in enumerate(schema.sparse.values()):
        if spec.multi_hot:
            out[f"list_{j}.values"] = ("<u4", None)
            out[f"list_{j}.offsets"] = ("<i8", None)
            if spec.weights:
                out[f"list_{j}.weights"] = ("<f4", None)
    if schema.group_by is not None:
        out["groups"] = ("<i8", None)
    return out


class ShardWriter:
    """Appends encoded rows to one shard (``<stem>.<suffix>.npy`` files)."""

    def __init__(self, stem: str, schema: DatasetSchema) -> None:
        self.schema = schema
        self.files = {k: NpyAppender(f"{stem}.{k}.npy", dt, w)
                      for k, (dt, w) in shard_files(schema).items()}  # fmt: skip
        self.ends = {j: 0 for j, c in enumerate(schema.sparse.values()) if c.multi_hot}
        # per feature with a vocabulary, its unseen rows' last (rows 1..oov_buckets)
        self.oov = {n: schema.id_spec(n).oov_buckets for n in schema.sparse
                    if schema.has_vocabulary(n)}  # fmt: skip
        self.unseen = dict.fromkeys(self.oov, 0)
        for j in self.ends:
            self.files[f"list_{j}.offsets"].append(np.zeros(1, np.int64))

    def append(self, enc: Encoded) -> None:
        assert enc.labels is not None
        self.files["dense"].append(enc.dense)
        self.files["labels"].append(enc.labels)
        one_hot = [enc.ids[n] for n, c in self.schema.sparse.items() if not c.multi_hot]
        self.files["ids"].append(np.stack(one_hot, 1) if one_hot else np.zeros((len(enc), 0)))
        if "groups" in self.files:
            assert enc.groups is not None
            self.files["groups"].append(enc.groups)
        for name, last in self.oov.items():
            ids = enc.ids[name]
            self.unseen[name] += int(((ids >= 1) & (ids <= last)).sum())
        for j, name in enumerate(self.schema.sparse):
            lens = enc.lengths[name]
            if lens is None:
                continue
            self.files[f"list_{j}.values"].append(enc.ids[name])
            if f"list_{j}.weights" in self.files:
                self.files[f"list_{j}.weights"].append(enc.weights[name])
            self.files[f"list_{j}.offsets"].append(self.ends[j] + np.cumsum(lens))
            self.ends[j] += int(lens.sum())

    def close(self, name: str) -> dict[str, Any]:
        for f in self.files.values():
            f.close()
        rows = self.files["dense"].rows
        ids = {n: self.ends.get(j, rows) for j, n in enumerate(self.schema.sparse)}
        return {"name": name, "rows": rows, "ids": ids, "unseen": dict(self.unseen)}

"""A seeded pseudo-random permutation of ``[0, n)`` evaluated per position, in O(1) memory.

Shuffling a worker's rows each epoch with ``rng.permutation(n)`` holds ``8 n`` bytes: 2 GB for the
~260M rows one of 16 workers gets from Criteo Terabyte, growing with the number of days. Here the
permutation is a keyed function: a balanced Feistel network on the ``2h`` bits of the smallest
even-width power of two ``>= n`` is a bijection on ``[0, 4^h)``, and cycle-walking (re-applying it
until the value lands below ``n``) restricts it to a bijection on ``[0, n)``. A batch asks for the
images of its positions only::

    perm = Permutation(n, key=(seed, epoch, rank))
    rows = perm(np.arange(start, start + batch))   # distinct, in [0, n)
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixing bijection of uint64."""
    x = x ^ (x >> np.uint64(30))
    x = (x * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    x = x ^ (x >> np.uint64(27))
    x = (x * np.uint64(0x94D049BB133111EB)) & _MASK64
    return x ^ (x >> np.uint64(31))


def _round_keys(key: tuple[int, ...]) -> list[np.uint64]:
    state = np.array([0x9E3779B97F4A7C15], dtype=np.uint64)
    for k in key:
        state = _mix(state ^ np.uint64(k & 0xFFFFFFFFFFFFFFFF))
    keys = []
    for r in range(ROUNDS):
        state = _mix(state + np.uint64(r + 1))
        keys.append(state[0])
    return keys


class Permutation:
    """A bijection of ``[0, n)`` chosen by ``key``; ``perm(positions) -> images``."""

    def __init__(self, n: int, key: tuple[int, ...]) -> None:
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2  # each Feistel half has `half` bits
        self.lo_mask = np.uint64((1 << self.half) - 1)
        self.keys = _round_keys(key)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        left, right = x >> h, x & self.lo_mask
        with np.errstate(over="ignore"):
            for k in self.keys:
                left, right = right, left ^ (_mix(right ^ k) & self.lo_mask)
        return (left << h) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Images of ``positions`` (ints in ``[0, n)``) as int64, same shape."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        out = self._feistel(pos.astype(np.uint64))
        todo = np.flatnonzero(out >= np.uint64(self.n))
        while todo.size:  # cycle-walk: expected < 4 rounds as 4^h < 4 n
            out[todo] = self._feistel(out[todo])
            todo = todo[out[todo] >= np.uint64(self.n)]
        return out.astype(np.int64)

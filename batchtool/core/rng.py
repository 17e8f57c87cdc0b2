"""Counter-based randomness: every draw is a pure function of (seed, stage, example id, draw index).

No shared sequential generator is ever used, so results cannot depend on thread
count, batch boundaries or the engine (DESIGN.md invariant 1).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_TWO53 = 2.0 ** -53

SHARD_BITS = 40
"""Example ids are `shard << SHARD_BITS | row`: 2**24 shards of up to 2**40 rows."""


def example_ids(shard: int, first_row: int, count: int) -> np.ndarray:
    """Stable ids of `count` consecutive rows of one shard."""
    base = (shard << SHARD_BITS) + first_row
    return np.arange(base, base + count, dtype=np.uint64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijection on uint64 with full avalanche."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _S30)) * _M1
        x = (x ^ (x >> _S27)) * _M2
        return x ^ (x >> _S31)


def stream_key(seed: int, stage: str) -> np.uint64:
    """A 64-bit key for one (seed, stage) pair, so stages never share draws."""
    digest = hashlib.blake2b(f"{int(seed)}\x00{stage}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def keyed_hash(seed: int, stage: str, ids: np.ndarray, draw: int = 0) -> np.ndarray:
    """uint64 hash per id. For fixed (seed, stage, draw) it is a bijection of ids, so sort keys never tie."""
    key = stream_key(seed, stage)
    with np.errstate(over="ignore"):
        x = np.asarray(ids, dtype=np.uint64) + np.uint64(draw) * _GOLDEN
        return _mix64(_mix64(x ^ key) + key)


def uniform(seed: int, stage: str, ids: np.ndarray, draw: int = 0) -> np.ndarray:
    """Uniform float64 in [0, 1) per id, with 53 random bits."""
    return (keyed_hash(seed, stage, ids, draw) >> np.uint64(11)).astype(np.float64) * _TWO53


def poisson(seed: int, stage: str, ids: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Poisson(rate) count per id, exact for any rate (inversion below 10, PTRS rejection above)."""
    ids = np.asarray(ids, dtype=np.uint64)
    rates = np.asarray(rates, dtype=np.float64)
    counts = np.zeros(len(ids), dtype=np.int64)
    small = rates < 10.0
    if small.any():
        counts[small] = _poisson_inversion(uniform(seed, stage, ids[small], 0), rates[small])
    large = ~small
    if large.any():
        counts[large] = _poisson_ptrs(seed, stage, ids[large], rates[large])
    return counts


def _poisson_inversion(u: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Sequential search of the CDF; rates here are < 10 so it ends within ~45 steps."""
    k = np.zeros(len(u), dtype=np.int64)
    p = np.exp(-lam)
    cdf = p.copy()
    active = u >= cdf
    step = 0
    while active.any():
        step += 1
        idx = np.nonzero(active)[0]
        p[idx] *= lam[idx] / step
        cdf[idx] += p[idx]
        k[idx] = step
        active[idx] = (u[idx] >= cdf[idx]) & (p[idx] > 0)
    return k


_lgamma = np.frompyfunc(math.lgamma, 1, 1)


def _poisson_ptrs(seed: int, stage: str, ids: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Hörmann's transformed rejection with squeeze (PTRS); each retry uses the next two draws of the id."""
    slam = np.sqrt(lam)
    loglam = np.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    invalpha = 1.1239 + 1.1328 / (b - 3.4)
    vr = 0.9277 - 3.6224 / (b - 2.0)
    out = np.full(len(ids), -1, dtype=np.int64)
    pending = np.arange(len(ids))
    attempt = 0
    while len(pending):
        sub = ids[pending]
        u = uniform(seed, stage, sub, 2 * attempt) - 0.5
        v = uniform(seed, stage, sub, 2 * attempt + 1)
        us = 0.5 - np.abs(u)
        ap, bp, lp = a[pending], b[pending], lam[pending]
        k = np.floor((2.0 * ap / us + bp) * u + lp + 0.43)
        accept = (us >= 0.07) & (v <= vr[pending])
        maybe = ~accept & (k >= 0) & ~((us < 0.013) & (v > us))
        if maybe.any():
            m = np.nonzero(maybe)[0]
            lhs = np.log(v[m]) + np.log(invalpha[pending][m]) - np.log(ap[m] / (us[m] * us[m]) + bp[m])
            rhs = -lp[m] + k[m] * loglam[pending][m] - _lgamma(k[m] + 1.0).astype(np.float64)
            accept[m] = lhs <= rhs
        out[pending[accept]] = k[accept].astype(np.int64)
        pending = pending[~accept]
        attempt += 1
    return out


def permutation_keys(seed: int, stage: str, ids: np.ndarray) -> np.ndarray:
    """Sort keys whose order is a uniformly random permutation of ids (no ties: the hash is a bijection)."""
    return keyed_hash(seed, stage, ids, draw=0)


_FEISTEL_ROUNDS = 6


def index_shuffle(seed: int, stage: str, index: np.ndarray, size: np.ndarray | int, tweak: np.ndarray | int = 0,
                  inverse: bool = False) -> np.ndarray:
    """Position of each `index` in a keyed pseudo-random permutation of [0, size) (Grain's index_shuffle).

    A balanced Feistel network over the smallest even number of bits that covers `size`, cycle-walked
    back into range: no table, so permuting billions of positions costs no memory, and any one index is
    mapped on its own. `tweak` (< 2**32, per element like `size`) selects one of many independent
    permutations; `inverse=True` maps positions back to indices.
    """
    x = np.array(index, dtype=np.uint64, copy=True).reshape(-1)
    size = np.broadcast_to(np.asarray(size, dtype=np.uint64), x.shape)
    tweak = np.broadcast_to(np.asarray(tweak, dtype=np.uint64), x.shape) << np.uint64(32)
    half = np.zeros(x.shape, dtype=np.uint64)
    while True:
        short = (np.uint64(1) << (half * np.uint64(2))) < size
        if not short.any():
            break
        half += short
    mask = (np.uint64(1) << half) - np.uint64(1)
    rounds = range(_FEISTEL_ROUNDS - 1, -1, -1) if inverse else range(_FEISTEL_ROUNDS)

    def encrypt(v: np.ndarray, h: np.ndarray, m: np.ndarray, t: np.ndarray) -> np.ndarray:
        left, right = v >> h, v & m
        for r in rounds:
            if inverse:
                left, right = right ^ (keyed_hash(seed, stage, left | t, draw=r) & m), left
            else:
                left, right = right, left ^ (keyed_hash(seed, stage, right | t, draw=r) & m)
        return (left << h) | right

    pending = np.arange(len(x))
    while len(pending):  # cycle walking: re-encrypt until the value is back in [0, size)
        x[pending] = encrypt(x[pending], half[pending], mask[pending], tweak[pending])
        pending = pending[x[pending] >= size[pending]]
    return x.reshape(np.shape(index))

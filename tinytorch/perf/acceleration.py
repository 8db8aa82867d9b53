from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

def cache_sizes() -> dict:
    """This machine's data cache sizes in bytes: {'L1': ..., 'L2': ..., 'L3': ...}.

    Read from /sys/devices/system/cpu/cpu0/cache (Linux), else `os.sysconf` where it knows them,
    else typical values (32 KiB, 1 MiB, 32 MiB) with 'source' saying so.
    """
    sizes, root = {}, Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")) if root.exists() else []:
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        sizes[f"L{level}"] = int(text.rstrip("KMG")) * scale
    source = "sysfs"
    if not sizes:
        source = "sysconf"
        for level, name in ((1, "SC_LEVEL1_DCACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
            try:
                value = os.sysconf(name)
            except (ValueError, OSError, AttributeError):
                value = 0
            if value and value > 0:
                sizes[f"L{level}"] = value
    if not sizes:
        source, sizes = "typical values", {"L1": 32 * 1024, "L2": 1024 ** 2, "L3": 32 * 1024 ** 2}
    sizes["source"] = source
    return sizes

def naive_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A @ B with three Python loops, one multiply-add at a time (small matrices only).

    TODO (Exercise 17.6): the textbook i-j-k loops over the elements, accumulating in a float.

    CONTRACT: `a` (n, k), `b` (k, m) 2-D; returns float32 (n, m). Mismatched inner sizes raise
    `ValueError("naive_matmul: inner sizes differ: a is (2, 3), b is (4, 5)")`.
    EXAMPLE: `naive_matmul(np.eye(2), [[1, 2], [3, 4]])` -> `[[1, 2], [3, 4]]`.
    HINTS: `range`, `np.zeros`; read elements as Python floats (`float`) to see the interpreter's cost.
    """
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"naive_matmul: inner sizes differ: a is {a.shape}, b is {b.shape}")
    n, k = a.shape
    m = b.shape[1]
    out = np.zeros((n, m), np.float32)
    for i in range(n):
        for j in range(m):
            acc = 0.0
            for p in range(k):
                acc += float(a[i, p]) * float(b[p, j])
            out[i, j] = acc
    return out

def block_size_for(cache_bytes: int, itemsize: int = 4) -> int:
    """The tile edge `t` of a blocked matmul: three t x t tiles (of A, B and C) fit in `cache_bytes`.

    TODO (Exercise 17.7): the largest power of two `t` with `3 * t * t * itemsize <= cache_bytes`,
    at least 8.

    CONTRACT: `cache_bytes` a positive int; returns an int power of two >= 8.
    EXAMPLE: `block_size_for(512 * 1024)` -> 128 (3 * 128 * 128 * 4 = 196,608 bytes; 256 would need 786,432).
    HINTS: `math.isqrt`, `int.bit_length`.
    """
    if not isinstance(cache_bytes, int) or cache_bytes <= 0:
        raise ValueError(f"block_size_for: cache_bytes must be a positive int; got {cache_bytes!r}")
    t = math.isqrt(cache_bytes // (3 * itemsize))
    t = 1 << (t.bit_length() - 1) if t > 0 else 1
    return max(8, t)


def blocked_matmul(a: np.ndarray, b: np.ndarray, block: int | None = None) -> np.ndarray:
    """C = A @ B computed tile by tile: each (block x block) tile of C accumulates products of tiles of
    A and B that stay in the L2 cache while they are used. `block` defaults to `block_size_for(L2)`.
    The tile products are NumPy calls: what is measured is the loop order and the tile size."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"blocked_matmul: inner sizes differ: a is {a.shape}, b is {b.shape}")
    t = block or block_size_for(cache_sizes().get("L2", 1024 ** 2))
    n, k = a.shape
    m = b.shape[1]
    out = np.zeros((n, m), np.float32)
    for i in range(0, n, t):
        for p in range(0, k, t):
            a_tile = a[i:i + t, p:p + t]
            for j in range(0, m, t):
                out[i:i + t, j:j + t] += a_tile @ b[p:p + t, j:j + t]
    return out


def matmul_gflops(n: int, seconds: float) -> float:
    "GFLOP/s of an n x n x n matmul that took `seconds`: 2 n^3 floating-point operations."
    return 2 * n ** 3 / seconds / 1e9

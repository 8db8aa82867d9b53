"""An example submission for `tito compete run DIR --task matmul`: correct, vectorised, not fast.

One NumPy call per row of the result: row i of C is row i of A times B, a (1, k) @ (k, m) product.
Beat it: fewer Python-level steps, tiles that stay in cache, a C kernel through ctypes...
The competition calls `matmul(a, b)` with float32 arrays a (n, k) and b (k, m), and expects a float32
array (n, m) equal to a @ b within the task's tolerance. Do not write into `a` or `b`.
"""
import numpy as np


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n, m = a.shape[0], b.shape[1]
    out = np.empty((n, m), dtype=np.float32)
    for i in range(n):
        out[i] = a[i] @ b
    return out

"""Module 17's naive matmul: three Python loops (timed on the small shapes only)."""
import numpy as np

from tinytorch.perf.kernels import naive_matmul


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return naive_matmul(a, b)

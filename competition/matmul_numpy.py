"""The reference: NumPy's fastest product of two 2-D float32 arrays, `np.dot` (BLAS's sgemm, called directly).

`np.matmul` is a ufunc with its own dispatch: on this course's machine it ran 1.2-1.4x slower than `np.dot`
on some of the task's shapes, so a bare `np.dot` would have "beaten NumPy". It is timed in turns with every
entry, in the entry's own process (tito.competition_worker), and the speedup is judged with an interval.
"""
import numpy as np


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.dot(a, b)

"""An example submission that the competition rejects: an off-by-one in the inner sum.

It leaves out the last term of every dot product (`k - 1` instead of `k`): the shape and dtype are
right, the values are not. Run `tito compete run DIR --task matmul` and read the reason it gives
(the input, the largest error and where it is).
"""
import numpy as np


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    return a[:, :k - 1] @ b[:k - 1]

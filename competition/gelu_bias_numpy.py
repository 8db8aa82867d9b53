"""The reference: the chain written as eager NumPy expressions (one temporary array per op)."""
import math

import numpy as np

C = math.sqrt(2 / math.pi)


def gelu_bias(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    y = x + bias
    return 0.5 * y * (1 + np.tanh(C * (y + 0.044715 * y * y * y)))

"""An example submission that the competition rejects: it forgets the bias.

Run `tito compete run DIR --task elementwise` and read the reason it gives (the largest error and where).
"""
import math

import numpy as np


def gelu_bias(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

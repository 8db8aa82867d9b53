"""An example submission for `tito compete run DIR --task elementwise`: correct, fewer temporaries.

The eager reference allocates a new array for every op of the chain; this one allocates one output
and updates it in place (`out=`). Beat it: process the array in cache-sized chunks, fuse the chain
into one C loop (module 17's compiler), ...
The competition calls `gelu_bias(x, bias)` with float32 x (n, d) and bias (d,), and expects the float32
array (n, d) gelu(x + bias) (tanh approximation) within the task's tolerance. Do not write into x or bias.
"""
import math

import numpy as np

C = math.sqrt(2 / math.pi)


def gelu_bias(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    y = np.add(x, bias)                  # y = x + bias (kept)
    t = np.multiply(y, y)                # y^2
    np.multiply(t, y, out=t)             # y^3
    np.multiply(t, 0.044715, out=t)
    np.add(t, y, out=t)
    np.multiply(t, C, out=t)
    np.tanh(t, out=t)
    np.add(t, 1.0, out=t)
    np.multiply(t, y, out=t)
    np.multiply(t, 0.5, out=t)
    return t

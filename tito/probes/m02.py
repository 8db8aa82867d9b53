"""Probes of module 02 (activations): see tito/probes/__init__.py."""
import numpy as np

from . import probe


def _inputs(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32) * 3
    big = np.array([[-1000.0, -50.0, 0.0, 50.0, 1000.0]], dtype=np.float32)
    return x, big


def _activation(name, **kw):
    def run(rng, rec):
        import tinytorch.core.activations as A
        from tinytorch.core.tensor import Tensor

        act = getattr(A, name)(**kw)
        x, big = _inputs(rng)
        rec.call("out", lambda: act(Tensor(x)))
        rec.call("big", lambda: act(Tensor(big)))
        rec.call("ints", lambda: act(Tensor(np.arange(-2, 3))))
        rec.call("f64", lambda: act(Tensor(x.astype(np.float64), dtype=np.float64)))
        if kw:
            rec.call("dim0", lambda: getattr(A, name)(dim=0)(Tensor(x)))
            rec.call("dim3d", lambda: getattr(A, name)(dim=1)(Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))))
    return run


probe("2.1")(_activation("ReLU"))
probe("2.2")(_activation("Sigmoid"))
probe("2.3")(_activation("Tanh"))
probe("2.4")(_activation("GELU"))
probe("2.5")(_activation("Softmax", dim=-1))
probe("2.6")(_activation("LogSoftmax", dim=-1))

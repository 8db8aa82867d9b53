"""Probes of module 04 (losses): see tito/probes/__init__.py. The losses replay the reference's recorded
outcomes of `log_sum_exp` where they call it (4.3), so a bug there is charged to 4.1 only."""
import numpy as np

from . import probe


@probe("4.1")
def log_sum_exp(rng, rec):
    from tinytorch.core.losses import log_sum_exp as lse
    from tinytorch.core.tensor import Tensor

    x = rng.standard_normal((4, 5)).astype(np.float32) * 5
    rec.call("last", lse, Tensor(x))
    rec.call("axis0", lse, Tensor(x), axis=0)
    rec.call("keep", lse, Tensor(x), axis=1, keepdims=True)
    rec.call("big", lse, Tensor(np.array([[1000.0, 1000.0], [-1000.0, 5.0]], dtype=np.float32)))
    rec.call("neginf", lse, Tensor(np.array([[-np.inf, -np.inf], [0.0, -np.inf]], dtype=np.float32)))
    rec.call("f64", lse, Tensor(x.astype(np.float64), dtype=np.float64))
    rec.call("list", lse, [[1.0, 2.0, 3.0]])


@probe("4.2")
def mse(rng, rec):
    from tinytorch.core.losses import MSELoss
    from tinytorch.core.tensor import Tensor

    p, t = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    rec.call("loss", MSELoss(), Tensor(p), Tensor(t))
    rec.call("arrays", MSELoss(), p, t)
    rec.call("vec", MSELoss(), Tensor(p[:, 0]), Tensor(t[:, 0]))
    rec.call("shape", MSELoss(), Tensor(p), Tensor(t[:, :2]))
    rec.call("bcast", MSELoss(), Tensor(p[:, :1]), Tensor(t[:, 0]))


@probe("4.3", replay=("log_sum_exp",))
def cross_entropy(rng, rec):
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.tensor import Tensor

    ce = CrossEntropyLoss()
    z = rng.standard_normal((6, 5)).astype(np.float32) * 3
    y = rng.integers(0, 5, size=6)
    rec.call("loss", ce, Tensor(z), Tensor(y))
    rec.call("big", ce, Tensor(np.array([[1000.0, 0.0, -1000.0], [0.0, 2000.0, 0.0]], dtype=np.float32)),
             Tensor(np.array([2, 1])))
    rec.call("f64", ce, Tensor(z.astype(np.float64), dtype=np.float64), Tensor(y))
    rec.call("list_target", ce, Tensor(z), y.tolist())
    rec.call("e_1d", ce, Tensor(z[0]), Tensor(y[:1]))
    rec.call("e_float", ce, Tensor(z), Tensor(y.astype(np.float32)))
    rec.call("e_shape", ce, Tensor(z), Tensor(y.reshape(6, 1)))
    bad = y.copy()
    bad[2], bad[4] = 7, -1
    rec.call("e_range", ce, Tensor(z), Tensor(bad))
    rec.call("e_empty", ce, Tensor(np.zeros((0, 5), dtype=np.float32)), Tensor(np.zeros(0, dtype=np.int64)))


@probe("4.4", messages=False)
def bce(rng, rec):
    from tinytorch.core.losses import BinaryCrossEntropyLoss
    from tinytorch.core.tensor import Tensor

    b = BinaryCrossEntropyLoss()
    p = rng.uniform(0.01, 0.99, size=(8, 1)).astype(np.float32)
    t = (rng.random((8, 1)) > 0.5).astype(np.float32)
    rec.call("loss", b, Tensor(p), Tensor(t))
    rec.call("soft", b, Tensor(p), Tensor(rng.uniform(0, 1, size=(8, 1)).astype(np.float32)))
    rec.call("edges", b, Tensor(np.array([0.0, 1.0, 1.0, 0.0], dtype=np.float32)),
             Tensor(np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)))
    rec.call("tiny", b, Tensor(np.array([1e-8, 1 - 1e-8], dtype=np.float32)), Tensor(np.array([1.0, 0.0], dtype=np.float32)))
    rec.call("f64", b, Tensor(p.astype(np.float64), dtype=np.float64), Tensor(t.astype(np.float64), dtype=np.float64))
    rec.call("eps", BinaryCrossEntropyLoss(eps=1e-3), Tensor(np.array([0.0, 1.0], dtype=np.float32)),
             Tensor(np.array([1.0, 0.0], dtype=np.float32)))
    rec.call("e_shape", b, Tensor(p), Tensor(t[:, 0]))
    rec.call("e_empty", b, Tensor(np.zeros(0, dtype=np.float32)), Tensor(np.zeros(0, dtype=np.float32)))
    rec.call("e_logits", b, Tensor(np.array([-2.0, 3.0], dtype=np.float32)), Tensor(np.array([0.0, 1.0], dtype=np.float32)))
    rec.call("e_target", b, Tensor(np.array([0.5, 0.5], dtype=np.float32)), Tensor(np.array([0.0, 2.0], dtype=np.float32)))

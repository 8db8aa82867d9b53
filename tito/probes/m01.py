"""Probes of module 01 (tensor): see tito/probes/__init__.py. Every probe after 1.2 replays the reference's
recorded outcomes of `Tensor.__init__` (and 1.3, 1.4, 1.8 of `broadcast_shape`), so a bug there is charged to
1.1 / 1.2 only."""
import numpy as np

from . import probe

INIT = ("Tensor.__init__",)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _shape(rng, ndim):
    return tuple(int(s) for s in rng.integers(1, 5, size=ndim))


@probe("1.1")
def broadcast_shape(rng, rec):
    from tinytorch.core.tensor import broadcast_shape as bs

    for i in range(6):
        a = _shape(rng, int(rng.integers(0, 5)))
        b = tuple(1 if rng.random() < 0.4 else s for s in a[int(rng.integers(0, len(a) + 1)):])
        rec.call(f"ok{i}", bs, a, b, "add")
        rec.call(f"ok{i}r", bs, list(b), list(a), "mul")
        bad = a[:-1] + (a[-1] + 1,) if a and a[-1] > 1 else a + (3,)
        if a and a[-1] > 1:
            rec.call(f"bad{i}", bs, a, (a[-1] + 1,), "add")
    rec.call("scalars", bs, (), (), "add")
    rec.call("mismatch", bs, (2, 3), (4,), "add")


@probe("1.2")
def tensor_init(rng, rec):
    from tinytorch.core.tensor import Tensor

    x64 = rng.standard_normal((3, 2))
    x32 = x64.astype(np.float32)
    cases = {"f64": (x64,), "f32": (x32,), "ints": ([[1, 2], [3, 4]],), "bool": (np.array([True, False]),),
             "float": (2.5,), "int": (7,), "dtype": (x64, np.float64), "to_int": (x32 * 10, np.int32),
             "list": ([0.5, 1.5],), "int8": (np.arange(4, dtype=np.int8),)}
    for key, args in cases.items():
        t = rec.call(key, Tensor, *args)
        if t is not None:
            rec[key + "_grad"] = bool(getattr(t, "requires_grad", None))
    t = rec.call("nocopy", Tensor, x32)
    if t is not None:
        rec["nocopy_shares"] = bool(t.data is x32 or t.data.base is x32)
    t = Tensor(x32)
    rec.call("from_tensor", Tensor, t)
    g = rec.call("grad", Tensor, x32, requires_grad=True)
    if g is not None:
        rec["grad_flag"] = bool(g.requires_grad)
    rec.call("str", Tensor, ["a", "b"])
    rec.call("int_grad", Tensor, [1, 2], requires_grad=True)


@probe("1.3", replay=INIT + ("broadcast_shape",))
def elementwise(rng, rec):
    from tinytorch.core.tensor import Tensor

    a, b, c = Tensor(f32(rng, 3, 4)), Tensor(f32(rng, 4)), Tensor(f32(rng, 2, 1, 4))
    p = Tensor(np.abs(f32(rng, 3, 4)) + 0.5)
    i = Tensor(rng.integers(1, 9, size=(3, 4)))
    ops = {"add": lambda: a + b, "sub": lambda: a - c, "mul": lambda: a * b, "div": lambda: a / (p + 0.1),
           "pow": lambda: p ** 1.5, "pow2": lambda: p ** b, "radd": lambda: 2 + a, "rsub": lambda: 2.0 - a,
           "rmul": lambda: 0.5 * a, "rdiv": lambda: 1.0 / p, "rpow": lambda: 2.0 ** a, "neg": lambda: -a,
           "int_half": lambda: i * 0.5, "int_div": lambda: i / Tensor(rng.integers(1, 5, size=(4,))),
           "int_add": lambda: i + 3, "array": lambda: a + np.ones(4, dtype=np.float32), "bad": lambda: a + c[:, :, :3]}
    for k, fn in ops.items():
        rec.call(k, fn)


@probe("1.4", replay=INIT + ("broadcast_shape",))
def matmul(rng, rec):
    from tinytorch.core.tensor import Tensor

    cases = {"2d": ((3, 4), (4, 5)), "batch": ((2, 3, 4), (2, 4, 5)), "bcast": ((2, 1, 3, 4), (5, 4, 2)),
             "mv": ((3, 4), (4,)), "vm": ((4,), (4, 2)), "bad": ((3, 4), (5, 2)), "badbatch": ((2, 3, 4), (3, 4, 5))}
    for k, (sa, sb) in cases.items():
        rec.call(k, lambda sa=sa, sb=sb: Tensor(f32(rng, *sa)).matmul(Tensor(f32(rng, *sb))))
    x = Tensor(f32(rng, 2, 3))
    rec.call("op", lambda: x @ Tensor(f32(rng, 3, 2)))


@probe("1.5", replay=INIT)
def reduce(rng, rec):
    from tinytorch.core.tensor import Tensor

    x = Tensor(f32(rng, 2, 3, 4))
    for name in ("sum", "mean", "max", "var"):
        for axis in (None, 0, -1, (0, 2)):
            for keep in (False, True):
                rec.call(f"{name}_{axis}_{keep}", lambda n=name, ax=axis, kd=keep: getattr(x, n)(axis=ax, keepdims=kd))
    i = Tensor(rng.integers(0, 9, size=(3, 4)))
    rec.call("int_mean", lambda: i.mean(axis=0))
    rec.call("int_sum", lambda: i.sum())
    rec.call("bad_axis", lambda: x.sum(axis=3))


@probe("1.6", replay=INIT)
def views(rng, rec):
    from tinytorch.core.tensor import Tensor

    x = Tensor(f32(rng, 2, 3, 4))
    rec.call("r1", lambda: x.reshape(6, 4))
    rec.call("r2", lambda: x.reshape((4, -1)))
    rec.call("r3", lambda: x.reshape(24))
    rec.call("rbad", lambda: x.reshape(5, 5))
    rec.call("t1", lambda: x.transpose(0, 2))
    rec.call("t2", lambda: x.transpose())
    rec.call("tr", lambda: x.transpose(0, 1).reshape(3, 8))
    rec.call("tbad", lambda: x.transpose(0, 5))


@probe("1.7", replay=INIT)
def unary(rng, rec):
    from tinytorch.core.tensor import Tensor

    x, p = Tensor(f32(rng, 3, 4)), Tensor(np.abs(f32(rng, 3, 4)) + 0.1)
    for name, t in (("exp", x), ("log", p), ("sqrt", p), ("tanh", x), ("abs", x)):
        rec.call(name, lambda n=name, t=t: getattr(t, n)())
    rec.call("int_exp", lambda: Tensor(np.arange(4)).exp())


@probe("1.8", replay=INIT + ("broadcast_shape",))
def combine(rng, rec):
    from tinytorch.core.tensor import Tensor, concatenate, stack, where

    a, b = Tensor(f32(rng, 3, 4)), Tensor(f32(rng, 3, 4))
    cond = Tensor(rng.random((3, 4)) > 0.5)
    rec.call("where", where, cond, a, b)
    rec.call("where_scalar", where, cond, a, 0.0)
    rec.call("where_bcast", where, Tensor(rng.random(4) > 0.5), a, Tensor(f32(rng, 3, 1)))
    rec.call("cat0", concatenate, [a, b], axis=0)
    rec.call("cat1", concatenate, [a, b, a], axis=1)
    rec.call("cat_bad", concatenate, [a, Tensor(f32(rng, 2, 5))], axis=0)
    rec.call("stack0", stack, [a, b], axis=0)
    rec.call("stack_last", stack, [a, b], axis=-1)
    rec.call("stack_bad", stack, [a, Tensor(f32(rng, 4, 3))])

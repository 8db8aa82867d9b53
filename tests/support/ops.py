"""The reference table: every op of the course written once, in tinytorch, NumPy and PyTorch.

One row (`Op`) per operation: its name, the tinytorch call, the NumPy reference, the torch call,
the inputs it is defined on (a hypothesis strategy that draws shapes, memory layouts and values
from the op's domain), the exercise that writes its forward pass, and the module-06 exercise that
writes its gradient (None: not differentiable). Module tests select rows (`rows(module="01")`,
`rows(differentiable=True)`) and one property test drives them all: forward values against NumPy
in modules 01-04, values and gradients against `torch.autograd` in module 06. Benchmarks can read
the same rows. (minitorch's `testing.py` and tinygrad's `helper_test_op` are the models.)

A row's callables take the case's arguments in order: arrays become Tensors (or torch tensors)
where `Case.tensor` says so; everything else (labels, masks, conditions, Python numbers) is passed
as it is, converted to a torch tensor for the torch call.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from .strategies import (
    ANY, EXPONENT, MODERATE, NONZERO, POSITIVE, PROBABILITY, UNIT, Domain, axis_specs, broadcast_pairs, laid_out,
    matmul_shapes, shapes,
)


@dataclass
class Case:
    "One drawn input of an op: positional args, which of them are tensors, which need gradients, kwargs."

    args: tuple
    tensor: tuple  # bool per arg: wrap in a Tensor
    grad: tuple  # bool per arg: requires grad (only for tensor args)
    kwargs: dict = field(default_factory=dict)

    def describe(self) -> dict:
        "The inputs by name, for failure messages."
        out = {f"arg{i}": a for i, a in enumerate(self.args) if isinstance(a, np.ndarray)}
        out.update({k: v for k, v in self.kwargs.items()})
        return out


@dataclass(frozen=True)
class Op:
    name: str
    tt: Callable  # tt(*args, **kwargs) with tinytorch Tensors
    ref: Callable | None  # NumPy reference on arrays
    torch: Callable | None  # torch reference on torch tensors
    inputs: Callable[[], st.SearchStrategy]  # () -> strategy of Case
    module: str  # the module whose tests check the forward pass
    exercise: tuple | None  # (number, function) of the forward pass; None: given code
    grad_exercise: tuple | None = None  # module-06 (number, function) of the gradient; None: not differentiable
    grad_fn: str | None = None  # type name of the result's grad_fn ("MulBackward"); None: not recorded
    rtol: float = 1e-5
    atol: float = 1e-6
    symbol: str = ""  # for binary operators: "+"
    domains: tuple = ()  # for binary operators: (left, right)

    @property
    def differentiable(self) -> bool:
        return self.grad_exercise is not None

    def __repr__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def _tensors(*arrays_, grad=True, **kwargs) -> Case:
    n = len(arrays_)
    return Case(tuple(arrays_), (True,) * n, (grad,) * n, kwargs)


def elementwise(*domains: Domain, max_dims: int = 4):
    "Operands whose shapes broadcast together, one domain each."
    @st.composite
    def draw_case(draw):
        if len(domains) == 1:
            shps = (draw(shapes(max_dims=max_dims)),)
        else:
            shps = draw(broadcast_pairs(max_dims=max_dims, num_shapes=len(domains)))
        return _tensors(*(draw(laid_out(s, d), label=f"arg{i}") for i, (s, d) in enumerate(zip(shps, domains))))
    return draw_case


def reduction(domain: Domain = ANY, allow_empty_axes: bool = False):
    @st.composite
    def draw_case(draw):
        shape = draw(shapes(max_side=4))
        x = draw(laid_out(shape, domain), label="x")
        return _tensors(x, axis=draw(axis_specs(len(shape), allow_empty=allow_empty_axes), label="axis"),
                        keepdims=draw(st.booleans(), label="keepdims"))
    return draw_case


def matmul_inputs(domain: Domain = Domain(-2.0, 2.0)):
    @st.composite
    def draw_case(draw):
        sa, sb = draw(matmul_shapes())
        return _tensors(draw(laid_out(sa, domain), label="a"), draw(laid_out(sb, domain), label="b"))
    return draw_case


@st.composite
def _reshape_case(draw):
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    source = tuple(dims)
    target = tuple(draw(st.permutations(dims)))
    if draw(st.booleans()) and len(target) > 1:  # merge two axes
        target = (target[0] * target[1],) + target[2:]
    if draw(st.booleans()):  # one inferred axis
        target = (-1,) + target[1:]
    return _tensors(draw(laid_out(source), label="x"), shape=target)


@st.composite
def _transpose_case(draw):
    shape = draw(shapes(min_dims=2, max_dims=4, max_side=4))
    nd = len(shape)
    return _tensors(draw(laid_out(shape), label="x"), dim0=draw(st.integers(-nd, nd - 1)),
                    dim1=draw(st.integers(-nd, nd - 1)))


@st.composite
def _slices_case(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=5))
    index = []
    for n in shape:
        kind = draw(st.sampled_from(["slice", "int", "all"]))
        if kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":  # positive steps only: torch has no negative-step slices
            start = draw(st.integers(0, n - 1))
            index.append(slice(start, draw(st.integers(start + 1, n)), draw(st.integers(1, 2))))
        else:
            index.append(slice(None))
    return _tensors(draw(laid_out(shape), label="x"), index=tuple(index))


@st.composite
def _int_array_case(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    # repeated indices on purpose: their gradients must add up
    idx = draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=1, max_size=6), label="index")
    return _tensors(draw(laid_out(shape), label="x"), index=np.array(idx, dtype=np.int64))


@st.composite
def _where_case(draw):
    sc, sx, sy = draw(broadcast_pairs(num_shapes=3))
    cond = draw(arrays(np.bool_, sc), label="condition")
    return Case((cond, draw(laid_out(sx), label="x"), draw(laid_out(sy), label="y")),
                (False, True, True), (False, True, True))


@st.composite
def _masked_fill_case(draw):
    shape = draw(shapes())
    # the mask broadcasts to x's shape: a suffix of it with some axes set to 1
    k = draw(st.integers(0, len(shape)))
    mshape = tuple(n if draw(st.booleans()) else 1 for n in shape[len(shape) - k:])
    mask = draw(arrays(np.bool_, mshape), label="mask")
    value = draw(st.sampled_from([0.0, -1.5, 7.0]), label="value")
    return Case((draw(laid_out(shape), label="x"), mask, value), (True, False, False), (True, False, False))


@st.composite
def _join_case(draw, new_axis: bool):
    shape = draw(shapes(min_dims=0 if new_axis else 1, max_dims=3))
    ndim = len(shape) + (1 if new_axis else 0)
    axis = draw(st.integers(-ndim, ndim - 1), label="axis")
    count = draw(st.integers(1, 3))
    parts = []
    for i in range(count):
        s = list(shape)
        if not new_axis:
            s[axis] = draw(st.integers(1, 3))
        parts.append(draw(laid_out(tuple(s)), label=f"tensor{i}"))
    return Case((parts,), (True,), (True,), {"axis": axis})


@st.composite
def _classification_case(draw):
    n, c = draw(st.integers(1, 8)), draw(st.integers(1, 6))
    logits = draw(laid_out((n, c), MODERATE), label="logits")
    labels = np.asarray(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n), label="labels"), np.int64)
    return Case((logits, labels), (True, False), (True, False))


@st.composite
def _same_shape_pair(draw, left: Domain, right: Domain):
    shape = draw(shapes(min_dims=1, max_dims=3))
    return _tensors(draw(laid_out(shape, left), label="pred"), draw(laid_out(shape, right), label="target"))


def _dim_case(domain: Domain = MODERATE):
    @st.composite
    def draw_case(draw):
        shape = draw(shapes(min_dims=1))
        return _tensors(draw(laid_out(shape, domain), label="x"), dim=draw(st.integers(-len(shape), len(shape) - 1)))
    return draw_case


def _scalar_side(domain: Domain, scalar: float, side: str):
    "`x op scalar` (side='right') or `scalar op x` (side='left') with a fixed Python number."
    @st.composite
    def draw_case(draw):
        return _tensors(draw(laid_out(draw(shapes()), domain), label="x"), **{"scalar": scalar, "side": side})
    return draw_case


# ---------------------------------------------------------------------------------------------
# References (float64 NumPy where precision matters), each written once
# ---------------------------------------------------------------------------------------------
def ref_relu(x, dim=None):
    return np.maximum(x, 0.0)


def ref_sigmoid(x, dim=None):
    with np.errstate(over="ignore"):  # 1 / (1 + inf) = 0 is the right limit in the reference
        return 1.0 / (1.0 + np.exp(-x))


def ref_tanh(x, dim=None):
    return np.tanh(x)


def ref_gelu(x, dim=None):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def ref_softmax(x, dim=-1):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def ref_log_softmax(x, dim=-1):
    shifted = x - x.max(axis=dim, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))


def ref_log_sum_exp(x, axis=-1, keepdims=False):
    """NumPy's own stable reduction (an independent reference, not the notebook's formula)."""
    return np.logaddexp.reduce(np.asarray(x, dtype=np.float64), axis=axis, keepdims=keepdims)


def ref_mse(pred, target):
    d = np.asarray(pred, dtype=np.float64) - np.asarray(target, dtype=np.float64)
    return float(np.mean(d * d))


def ref_cross_entropy(logits, labels):
    "Mean over rows of -log softmax(z)[y], computed from shifted logits in float64."
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    s = z - z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(s).sum(axis=1)) - s[np.arange(len(y)), y]))


def ref_bce(p, t, eps=1e-7):
    p = np.clip(np.asarray(p, dtype=np.float64), eps, 1 - eps)
    t = np.asarray(t, dtype=np.float64)
    return float(-np.mean(t * np.log(p) + (1 - t) * np.log1p(-p)))


def _torch_dims(x, axis):
    return tuple(range(x.dim())) if axis is None else axis


def _torch_reduce(fn):
    def call(x, axis=None, keepdims=False):
        return fn(x, dim=_torch_dims(x, axis), keepdim=keepdims)
    return call


def _scalar_op(fn):
    def call(x, scalar, side):
        return fn(x, scalar) if side == "right" else fn(scalar, x)
    return call


def _np_scalar_op(fn):
    def call(x, scalar, side):
        s = np.float32(scalar)
        return fn(x, s) if side == "right" else fn(s, x)
    return call


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
def _tt():
    "The tinytorch callables, imported late so that a stubbed module fails its own tests only."
    from tinytorch.core import activations as A
    from tinytorch.core import losses as L
    from tinytorch.core import tensor as T
    return T, A, L


def _lazy(path: str):
    "A callable that looks `path` ('tensor.where') up in tinytorch when called."
    mod, attr = path.split(".")

    def call(*args, **kwargs):
        T, A, L = _tt()
        obj = getattr({"tensor": T, "activations": A, "losses": L}[mod], attr)
        return obj(*args, **kwargs)
    return call


def _act(cls: str, with_dim: bool = False):
    def call(x, dim=-1):
        _, A, _ = _tt()
        return getattr(A, cls)(dim=dim)(x) if with_dim else getattr(A, cls)()(x)
    return call


def _loss(cls: str):
    def call(*args):
        _, _, L = _tt()
        return getattr(L, cls)()(*args)
    return call


def _F():
    import torch.nn.functional as F
    return F


def _t():
    import torch
    return torch


E13 = ("1.3", "Tensor._elementwise")
E15 = ("1.5", "Tensor._reduce")
E17 = ("1.7", "Tensor._unary")
GIVEN = ("6.4", "backward")  # the rule is given: a wrong gradient points at the traversal

OPS: list[Op] = [
    # ----- module 01: binary operators (broadcasting) -----
    Op("add", operator.add, np.add, operator.add, elementwise(ANY, ANY), "01", E13, ("6.2", "unbroadcast"),
       "AddBackward", symbol="+", domains=(ANY, ANY)),
    Op("sub", operator.sub, np.subtract, operator.sub, elementwise(ANY, ANY), "01", E13, ("6.3", "sub_backward"),
       "SubBackward", symbol="-", domains=(ANY, ANY)),
    Op("mul", operator.mul, np.multiply, operator.mul, elementwise(ANY, ANY), "01", E13, ("6.3", "mul_backward"),
       "MulBackward", symbol="*", domains=(ANY, ANY)),
    Op("div", operator.truediv, np.true_divide, operator.truediv, elementwise(ANY, NONZERO), "01", E13,
       ("6.3", "div_backward"), "DivBackward", symbol="/", domains=(ANY, NONZERO)),
    Op("pow", operator.pow, np.power, operator.pow, elementwise(POSITIVE, EXPONENT), "01", E13,
       ("6.3", "pow_backward"), "PowBackward", symbol="**", domains=(POSITIVE, EXPONENT)),
    Op("pow_number_exponent", _scalar_op(operator.pow), _np_scalar_op(np.power), _scalar_op(operator.pow),
       _scalar_side(ANY, 3, "right"), "01", E13, ("6.3", "pow_backward"), "PowBackward"),
    Op("pow_number_base", _scalar_op(operator.pow), _np_scalar_op(np.power), _scalar_op(operator.pow),
       _scalar_side(Domain(-3.0, 3.0), 1.7, "left"), "01", E13, ("6.3", "pow_backward"), "PowBackward"),
    Op("rsub_number", _scalar_op(operator.sub), _np_scalar_op(np.subtract), _scalar_op(operator.sub),
       _scalar_side(ANY, 2.5, "left"), "01", E13, ("6.3", "sub_backward"), "SubBackward"),
    Op("rdiv_number", _scalar_op(operator.truediv), _np_scalar_op(np.true_divide), _scalar_op(operator.truediv),
       _scalar_side(NONZERO, 2.5, "left"), "01", E13, ("6.3", "div_backward"), "DivBackward"),
    Op("neg", operator.neg, np.negative, operator.neg, elementwise(ANY), "01", E13, GIVEN, "NegBackward"),
    # ----- matmul -----
    Op("matmul", operator.matmul, np.matmul, operator.matmul, matmul_inputs(), "01", ("1.4", "Tensor.matmul"),
       ("6.5", "matmul_backward"), "MatmulBackward", atol=1e-5),
    # ----- reductions -----
    Op("sum", lambda x, axis=None, keepdims=False: x.sum(axis=axis, keepdims=keepdims), np.sum,
       _torch_reduce(lambda x, **k: x.sum(**k)), reduction(), "01", E15, ("6.6", "sum_backward"), "SumBackward",
       atol=1e-4),
    Op("mean", lambda x, axis=None, keepdims=False: x.mean(axis=axis, keepdims=keepdims), np.mean,
       _torch_reduce(lambda x, **k: x.mean(**k)), reduction(), "01", E15, ("6.6", "mean_backward"),
       "MeanBackward", atol=1e-5),
    Op("max", lambda x, axis=None, keepdims=False: x.max(axis=axis, keepdims=keepdims), np.max,
       _torch_reduce(lambda x, **k: x.amax(**k)), reduction(), "01", E15, ("6.6", "max_backward"), "MaxBackward",
       atol=0),
    Op("var", lambda x, axis=None, keepdims=False: x.var(axis=axis, keepdims=keepdims), np.var,
       _torch_reduce(lambda x, **k: x.var(correction=0, **k)), reduction(), "01", E15, ("6.6", "var_backward"),
       "VarBackward", rtol=1e-4, atol=1e-4),
    # ----- views and indexing -----
    Op("reshape", lambda x, shape: x.reshape(shape), lambda x, shape: np.reshape(x, shape),
       lambda x, shape: x.reshape(shape), _reshape_case, "01", ("1.6", "Tensor.reshape"),
       ("6.7", "reshape_backward"), "ReshapeBackward", rtol=0, atol=0),
    Op("transpose", lambda x, dim0, dim1: x.transpose(dim0, dim1), lambda x, dim0, dim1: np.swapaxes(x, dim0, dim1),
       lambda x, dim0, dim1: x.transpose(dim0, dim1), _transpose_case, "01", ("1.6", "Tensor.transpose"),
       ("6.7", "transpose_backward"), "TransposeBackward", rtol=0, atol=0),
    Op("T", lambda x: x.T, lambda x: x.T, lambda x: x.permute(tuple(reversed(range(x.dim())))), elementwise(ANY), "01",
       None, GIVEN, "PermuteBackward", rtol=0, atol=0),
    Op("getitem_slices", lambda x, index: x[index], lambda x, index: x[index], lambda x, index: x[index],
       _slices_case, "01", None, ("6.7", "getitem_backward"), "GetitemBackward", rtol=0, atol=0),
    Op("getitem_int_array", lambda x, index: x[index], lambda x, index: x[index], lambda x, index: x[index],
       _int_array_case, "01", None, ("6.7", "getitem_backward"), "GetitemBackward", rtol=0, atol=0),
    Op("concatenate", lambda ts, axis: _lazy("tensor.concatenate")(ts, axis=axis),
       lambda xs, axis: np.concatenate(xs, axis=axis), lambda ts, axis: _t().cat(ts, dim=axis),
       lambda: _join_case(False), "01", ("1.8", "concatenate"), ("6.7", "concatenate_backward"),
       "ConcatenateBackward", rtol=0, atol=0),
    Op("stack", lambda ts, axis: _lazy("tensor.stack")(ts, axis=axis), lambda xs, axis: np.stack(xs, axis=axis),
       lambda ts, axis: _t().stack(ts, dim=axis), lambda: _join_case(True), "01", ("1.8", "stack"), GIVEN,
       "StackBackward", rtol=0, atol=0),
    # ----- elementwise functions -----
    Op("exp", lambda x: x.exp(), np.exp, lambda x: x.exp(), elementwise(Domain(-10.0, 5.0)), "01", E17,
       ("6.8", "exp_backward"), "ExpBackward"),
    Op("log", lambda x: x.log(), np.log, lambda x: x.log(), elementwise(POSITIVE), "01", E17,
       ("6.8", "log_backward"), "LogBackward"),
    Op("sqrt", lambda x: x.sqrt(), np.sqrt, lambda x: x.sqrt(), elementwise(POSITIVE), "01", E17,
       ("6.8", "sqrt_backward"), "SqrtBackward"),
    Op("tanh", lambda x: x.tanh(), np.tanh, lambda x: x.tanh(), elementwise(ANY), "01", E17,
       ("6.8", "tanh_backward"), "TanhBackward"),
    Op("abs", lambda x: x.abs(), np.abs, lambda x: x.abs(), elementwise(ANY), "01", E17, GIVEN, "AbsBackward"),
    Op("where", lambda c, x, y: _lazy("tensor.where")(c, x, y), np.where, lambda c, x, y: _t().where(c, x, y),
       _where_case, "01", ("1.8", "where"), ("6.8", "where_backward"), "WhereBackward", rtol=0, atol=0),
    Op("masked_fill", lambda x, m, v: x.masked_fill(m, v),
       lambda x, m, v: np.where(m, np.float32(v), x), lambda x, m, v: x.masked_fill(m, v), _masked_fill_case, "01",
       None, GIVEN, "MaskedFillBackward", rtol=0, atol=0),
    # ----- comparisons: boolean results, never recorded -----
    *[Op(name, fn, ref, fn, elementwise(Domain(-2.0, 2.0), Domain(-2.0, 2.0)), "01", None)
      for name, fn, ref in [("lt", operator.lt, np.less), ("le", operator.le, np.less_equal),
                            ("gt", operator.gt, np.greater), ("ge", operator.ge, np.greater_equal),
                            ("eq", operator.eq, np.equal), ("ne", operator.ne, np.not_equal)]],
    # ----- module 02: activations -----
    Op("relu", _act("ReLU"), ref_relu, lambda x: _t().relu(x), elementwise(MODERATE), "02", ("2.1", "ReLU.forward"),
       ("6.9", "relu_backward"), "ReluBackward", rtol=0, atol=0),
    Op("sigmoid", _act("Sigmoid"), ref_sigmoid, lambda x: _t().sigmoid(x), elementwise(MODERATE), "02",
       ("2.2", "Sigmoid.forward"), ("6.9", "sigmoid_backward"), "SigmoidBackward", atol=1e-7),
    Op("Tanh", _act("Tanh"), ref_tanh, lambda x: _t().tanh(x), elementwise(MODERATE), "02", ("2.3", "Tanh.forward"),
       ("6.8", "tanh_backward"), "TanhBackward", atol=1e-7),
    Op("gelu", _act("GELU"), ref_gelu, lambda x: _F().gelu(x, approximate="tanh"), elementwise(MODERATE), "02",
       ("2.4", "GELU.forward"), ("6.9", "gelu_backward"), "GeluBackward"),
    Op("softmax", _act("Softmax", True), ref_softmax, lambda x, dim=-1: _t().softmax(x, dim=dim), _dim_case(), "02",
       ("2.5", "Softmax.forward"), ("6.9", "softmax_backward"), "SoftmaxBackward"),
    Op("log_softmax", _act("LogSoftmax", True), ref_log_softmax, lambda x, dim=-1: _t().log_softmax(x, dim=dim),
       _dim_case(), "02", ("2.6", "LogSoftmax.forward"), GIVEN, "LogSoftmaxBackward", atol=1e-5),
    # ----- module 04: losses -----
    Op("log_sum_exp", lambda x, dim=-1: _lazy("losses.log_sum_exp")(x, axis=dim), lambda x, dim=-1:
       ref_log_sum_exp(x, axis=dim), lambda x, dim=-1: _t().logsumexp(x, dim=dim), _dim_case(), "04",
       ("4.1", "log_sum_exp"), GIVEN, "LogSumExpBackward", atol=1e-5),
    Op("mse", _loss("MSELoss"), ref_mse, lambda p, t: _F().mse_loss(p, t),
       lambda: _same_shape_pair(ANY, ANY), "04", ("4.2", "MSELoss.forward"), ("6.10", "mse_backward"), "MseBackward",
       atol=1e-5),
    Op("cross_entropy", _loss("CrossEntropyLoss"), ref_cross_entropy, lambda z, y: _F().cross_entropy(z, y.long()),
       _classification_case, "04", ("4.3", "CrossEntropyLoss.forward"), ("6.10", "cross_entropy_backward"),
       "CrossEntropyBackward"),
    Op("binary_cross_entropy", _loss("BinaryCrossEntropyLoss"), ref_bce, lambda p, t: _F().binary_cross_entropy(p, t),
       lambda: _same_shape_pair(PROBABILITY, UNIT), "04", ("4.4", "BinaryCrossEntropyLoss.forward"), GIVEN,
       "BinaryCrossEntropyBackward"),
]
BY_NAME = {op.name: op for op in OPS}
assert len(BY_NAME) == len(OPS), "op names in the reference table must be unique"


def rows(module: str | None = None, differentiable: bool | None = None, names=None) -> list[Op]:
    "Rows of the table, filtered by the module of their forward pass and by differentiability."
    out = [op for op in OPS if (module is None or op.module == module)
           and (differentiable is None or op.differentiable == differentiable)
           and (names is None or op.name in names)]
    return out


def params(ops, which: str | None = "forward"):
    """pytest params of `ops`, each marked with its exercise (`which`: 'forward', 'grad', or None for
    no per-op marker when the test function carries its own)."""
    import pytest

    out = []
    for op in ops:
        ex = {"forward": op.exercise, "grad": op.grad_exercise}.get(which)
        marks = [pytest.mark.exercise(*ex)] if ex else []
        out.append(pytest.param(op, id=op.name, marks=marks))
    return out


def tt_args(case: Case, requires_grad: bool = False) -> list:
    "The case's arguments for a tinytorch call: tensor args as Tensors (with requires_grad where asked)."
    from tinytorch.core.tensor import Tensor

    out = []
    for a, is_t, g in zip(case.args, case.tensor, case.grad):
        if is_t and isinstance(a, list):
            out.append([Tensor(x, requires_grad=requires_grad and g) for x in a])
        elif is_t:
            out.append(Tensor(a, requires_grad=requires_grad and g))
        else:
            out.append(a)
    return out


def torch_args(case: Case, requires_grad: bool = False) -> list:
    "The case's arguments for the torch call: copies as torch tensors (constants too), numbers as they are."
    from .compare import to_torch

    out = []
    for a, is_t, g in zip(case.args, case.tensor, case.grad):
        rg = requires_grad and is_t and g
        if isinstance(a, list):
            out.append([to_torch(x, requires_grad=rg) for x in a])
        elif isinstance(a, np.ndarray):
            out.append(to_torch(a, requires_grad=rg))
        else:
            out.append(a)
    return out


def torch_kwargs(case: Case) -> dict:
    "kwargs for torch: integer index arrays become torch tensors."
    from .compare import to_torch

    return {k: (to_torch(v) if isinstance(v, np.ndarray) else v) for k, v in case.kwargs.items()}


def grad_leaves(case: Case, tt: list) -> list:
    "(label, tinytorch tensor) of every argument that requires grad, in order (lists flattened)."
    out = []
    for i, (a, g) in enumerate(zip(tt, case.grad)):
        if not g:
            continue
        if isinstance(a, list):
            out += [(f"arg{i}[{j}]", x) for j, x in enumerate(a)]
        else:
            out.append((f"arg{i}", a))
    return out


def ref_value_and_grads(op: Op, case: Case, upstream) -> tuple[np.ndarray, list]:
    """Without torch: the row's NumPy reference value (on the float32 inputs) and, for every argument
    that requires grad (in `grad_leaves` order), its float64 central-difference gradient of
    sum(ref(...) * upstream) with the mask of where it is defined (`refs.numeric_grads`)."""
    from .refs import numeric_grads

    value = np.asarray(op.ref(*case.args, **case.kwargs))
    slots = []  # (arg index, list index or None) of every leaf
    for i, (a, g) in enumerate(zip(case.args, case.grad)):
        if g:
            slots += [(i, j) for j in range(len(a))] if isinstance(a, list) else [(i, None)]
    leaves = [case.args[i] if j is None else case.args[i][j] for i, j in slots]

    def f(*xs):
        args = [list(a) if isinstance(a, list) else a for a in case.args]
        for (i, j), x in zip(slots, xs):
            if j is None:
                args[i] = x
            else:
                args[i][j] = x
        return op.ref(*args, **case.kwargs)

    return value, numeric_grads(f, leaves, upstream)

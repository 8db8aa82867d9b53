"""Hypothesis strategies shared by the module tests: value domains, shapes, memory layouts.

Every array a test feeds to tinytorch is drawn by `laid_out`: a view of a larger base array with a
drawn layout (contiguous, transposed, strided, reversed), so an op that only works on fresh
contiguous arrays fails somewhere in the suite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays, mutually_broadcastable_shapes

def phases() -> list[Phase]:
    """The phases of a property test. The `explain` phase is left out: on a failing test it costs seconds per test
    and adds nothing to a minimal (shrunk) counterexample. Only the phases the loaded profile allows, read when a
    test's settings are made (its module's import, after the plugins configured hypothesis; this module itself may be
    imported earlier, by `-p tests.support.no_torch`): under `tito test` (its "tito" profile) a failing property test
    reports its first failing example instead of shrinking it, which cost a student's `tito test 01` on the stubs
    about 0.8 s per test (9 s for matmul)."""
    return [p for p in (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
            if p in settings.default.phases]


def property_settings(max_examples: int = 50) -> settings:
    """Hypothesis settings of a property test: a modest budget, no deadline, and no `too_slow` health
    check (on a loaded shared machine drawing a few small arrays can take a second)."""
    return settings(max_examples=max_examples, deadline=None, phases=phases(),
                    suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Domain:
    """Where an operand's values may lie: [lo, hi], and |v| >= min_abs (e.g. away from 0 for /)."""

    lo: float
    hi: float
    min_abs: float = 0.0

    def elements(self) -> st.SearchStrategy[float]:
        "float32-representable values for array elements."
        if self.min_abs:
            neg = [st.floats(self.lo, -self.min_abs, width=32)] if self.lo <= -self.min_abs else []
            pos = [st.floats(self.min_abs, self.hi, width=32)] if self.hi >= self.min_abs else []
            return st.one_of(*neg, *pos)
        return st.floats(self.lo, self.hi, width=32)

    def scalars(self) -> st.SearchStrategy[int | float]:
        "Python ints and floats (never NumPy scalars) for the scalar side of an operator."
        ok = lambda v: abs(v) >= self.min_abs  # noqa: E731
        ints = st.integers(math.ceil(self.lo), math.floor(self.hi)).filter(ok)
        floats = st.floats(self.lo, self.hi, allow_nan=False, allow_infinity=False).filter(ok)
        return st.one_of(ints, floats)


ANY = Domain(-10.0, 10.0)
NONZERO = Domain(-5.0, 5.0, min_abs=0.5)  # divisors; Dropout inputs (a zero would hide the mask)
POSITIVE = Domain(0.25, 4.0)  # bases of **, arguments of log and sqrt
EXPONENT = Domain(-3.0, 3.0)  # exponents of **
MODERATE = Domain(-20.0, 20.0)  # where float32 activations compare tightly
PROBABILITY = Domain(1 / 64, 63 / 64)  # predictions of binary cross-entropy (float32-exact bounds)
UNIT = Domain(0.0, 1.0)  # targets of binary cross-entropy

# Activations must survive values past exp's float32 range on both sides.
HUGE = st.floats(-1e4, 1e4, width=32)
EDGES = st.sampled_from([-1e4, -1e3, -100.0, -89.0, -88.0, -20.0, -1e-6, 0.0, 1e-6, 20.0, 88.0, 89.0, 100.0, 1e3, 1e4])
EXTREME = st.one_of(EDGES, HUGE)


@st.composite
def laid_out(draw, shape, domain: Domain | st.SearchStrategy = ANY, dtype=np.float32) -> np.ndarray:
    """An array of exactly `shape` whose memory layout is drawn too.

    It is a view of a larger base array: every axis is sliced with a step of 1 or 2, forwards or
    backwards, then the axes are permuted. Identity permutation and unit steps give an ordinary
    C-contiguous array; anything else is a non-contiguous view (strides that skip, run backwards
    or are out of order). `domain` is a `Domain` or a strategy for the elements.
    """
    shape = tuple(shape)
    ndim = len(shape)
    elements = domain.elements() if isinstance(domain, Domain) else domain
    perm = draw(st.permutations(range(ndim))) if ndim else []
    steps = draw(st.lists(st.sampled_from([1, 2, -1, -2]), min_size=ndim, max_size=ndim))
    pre = [0] * ndim  # shape before the permutation: pre[perm[i]] == shape[i]
    for i, p in enumerate(perm):
        pre[p] = shape[i]
    base = draw(arrays(dtype, tuple(n * abs(s) for n, s in zip(pre, steps)), elements=elements))
    # the trailing Ellipsis keeps a 0-d result an array view (base[()] would be a NumPy scalar)
    view = base[tuple(slice(None, None, s) for s in steps) + (Ellipsis,)].transpose(perm)
    assert view.shape == shape
    return view


def layout(x: np.ndarray) -> str:
    "How an input is laid out, for failure messages."
    x = np.asarray(x)
    kind = "contiguous" if x.flags["C_CONTIGUOUS"] else "non-contiguous"
    return f"shape {x.shape}, strides {x.strides} ({kind})"


def shape_id(shape) -> str:
    "A test id for a shape: (2, 3) -> '2x3'."
    return "x".join(map(str, shape)) or "scalar"


def shapes(min_dims=0, max_dims=4, min_side=1, max_side=3):
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_pairs(min_dims=0, max_dims=4, min_side=1, max_side=3, num_shapes=2):
    "Shapes that broadcast together (any may have fewer dimensions or size-1 axes)."
    return mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    ).map(lambda s: s.input_shapes)


@st.composite
def incompatible_pairs(draw):
    "Two shapes that do NOT broadcast: one aligned axis has sizes x != y, both > 1."
    a, b = draw(broadcast_pairs(min_dims=1))
    k = draw(st.integers(1, min(len(a), len(b))))  # axis -k, aligned from the right
    x = draw(st.integers(2, 5))
    y = draw(st.integers(2, 5).filter(lambda v: v != x))
    a = a[: len(a) - k] + (x,) + a[len(a) - k + 1 :]
    b = b[: len(b) - k] + (y,) + b[len(b) - k + 1 :]
    return a, b


@st.composite
def axis_specs(draw, ndim: int, allow_empty: bool = True):
    "None, an int or a tuple of distinct axes, each written as a positive or negative index."
    if ndim == 0:
        return None
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    spell = lambda ax: ax - ndim if draw(st.booleans()) else ax  # noqa: E731
    if kind == "int":
        return spell(draw(st.integers(0, ndim - 1)))
    axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=0 if allow_empty else 1, max_size=ndim))
    return tuple(spell(ax) for ax in axes)


@st.composite
def matmul_shapes(draw, aligned: bool = True):
    """Shapes of `a @ b`: each operand a vector, a matrix or a batch of matrices
    (batch dimensions broadcast). With aligned=False the inner sizes differ."""
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    k_b = k if aligned else draw(st.integers(1, 5).filter(lambda v: v != k))
    batch_a, batch_b = draw(broadcast_pairs(min_dims=1, max_dims=2))
    kind_a = draw(st.sampled_from(["vector", "matrix", "batched"]))
    kind_b = draw(st.sampled_from(["vector", "matrix", "batched"]))
    a = {"vector": (k,), "matrix": (n, k), "batched": batch_a + (n, k)}[kind_a]
    b = {"vector": (k_b,), "matrix": (k_b, m), "batched": batch_b + (k_b, m)}[kind_b]
    return a, b

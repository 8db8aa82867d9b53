"""Module 17's part of the shared test support: generated C judged by what it computes.

- `SPECIAL`: float32 values that every compiled kernel must treat as NumPy does (NaN, infinities, signed
  zeros, a subnormal, values past exp's range).
- `ELEMENTWISE_ROWS`: the compiler's elementwise op names (`ELEMENTWISE`) -> their rows of the reference
  table (`ops.py`: the tinytorch call, the NumPy and torch references, the input domain), so the compiler
  is checked on the same ops and domains as modules 01-02.
- `expression_functions(cases)`: C expressions (what `c_expression` returns) compiled, each into a loop
  `out[i] = expression` with `v0 = a0[i]`, `v1 = a1[i]`, by the package's `build_c_kernel`; returns
  callables on float32 arrays. The text of the expression is never compared: only its numbers.
- `run_loop(source, name, n_args, arrays, n_out, n_outer)`: a generated kernel (`loop_source`) called on
  float32 arrays, with guard elements after the output that must stay untouched.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .ops import BY_NAME

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3.0e38, -3.0e38, -88.5, 88.5, 100.0, -100.0, 0.5, -2.0],
                   np.float32)

# compiler op name -> reference-table row ("tanh" is Tensor.tanh; relu, sigmoid, gelu are module 02's activations)
ELEMENTWISE_ROWS = {name: BY_NAME[name] for name in
                    ("add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "tanh", "abs", "relu", "sigmoid",
                     "gelu")}
BINARY = ("add", "sub", "mul", "div", "pow")
EXACT = ("add", "sub", "mul", "div")  # IEEE arithmetic: a kernel's float32 result is NumPy's bit for bit
GUARD = -7.0  # what the elements after a kernel's output hold before the call (and must hold after it)


def _function(source: str, name: str, n_args: int):
    from tinytorch.perf.compiler import build_c_kernel

    fn = build_c_kernel(source, name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p] * (n_args + 1) + [ctypes.c_int64]
    return fn


def expression_functions(cases) -> dict:
    """{key: fn(*float32 arrays) -> float32 array} for `cases` [(key, C expression, number of inputs)], all
    compiled in one C file (one compiler run)."""
    lines = ["#include <math.h>", "#include <stdint.h>"]
    for k, (_, expr, n_in) in enumerate(cases):
        params = "".join(f"const float *a{j}, " for j in range(n_in))
        loads = " ".join(f"const float v{j} = a{j}[i];" for j in range(n_in))
        lines.append(f"void case_{k}({params}float *out, int64_t n) {{\n"
                     f"    for (int64_t i = 0; i < n; i++) {{ {loads} out[i] = {expr}; }}\n}}")
    source = "\n".join(lines) + "\n"

    def make(k, n_in):
        fn = _function(source, f"case_{k}", n_in)

        def run(*arrays):
            arrays = [np.ascontiguousarray(np.broadcast_to(a, np.shape(arrays[0])), np.float32) for a in arrays]
            out = np.empty(arrays[0].shape, np.float32)
            fn(*[a.ctypes.data for a in arrays], out.ctypes.data, out.size)
            return out
        return run
    return {key: make(k, n_in) for k, (key, _, n_in) in enumerate(cases)}


def run_loop(source: str, name: str, n_args: int, arrays, n_out: int, n_outer: int) -> np.ndarray:
    """Call the kernel `name` of `source` on float32 copies of `arrays`; returns its `n_out` outputs. Fails when
    it wrote past them (into the guard elements)."""
    fn = _function(source, name, n_args)
    arrays = [np.ascontiguousarray(a, np.float32) for a in arrays]
    out = np.full(n_out + 4, GUARD, np.float32)
    fn(*[a.ctypes.data for a in arrays], out.ctypes.data, n_outer)
    assert np.all(out[n_out:] == GUARD), f"kernel {name} wrote past the end of its {n_out} outputs:\n{source}"
    return out[:n_out]


def same_floats(got, want, exact: bool, rtol: float = 2e-5, atol: float = 1e-6) -> np.ndarray:
    "Elementwise: NaN where NaN, infinities equal, else equal (`exact`) or within rtol/atol."
    got, want = np.asarray(got), np.asarray(want)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(want), np.isnan(got), (got == want) if exact else np.isclose(got, want, rtol=rtol, atol=atol))

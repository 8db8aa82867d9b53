"""What every module test shares: strategies, one comparison helper, warning guards, the op table.

    from tests.support import laid_out, check_close, OPS, rows

`strategies` draws shapes, broadcastable pairs, value domains and memory layouts; `compare` holds
the comparison helper with explicit tolerances, the warning guards and the copying bridge to
PyTorch; `ops` is the reference table (one row per op: tinytorch, NumPy and torch calls, input
domain, exercise); `refs` holds the references that need no torch (NumPy forward formulas for the
op families of modules 05-13, the optimizers' update rules in closed form, float64 central
differences for gradients), which every torch comparison falls back to where torch is missing;
`mutation` runs a module's package tests on a copy of the package with one line changed.
"""
from .compare import (
    ATOL, GRAD_ATOL, GRAD_RTOL, RTOL, assert_close, check_close, describe_inputs, no_float_warnings, no_warnings,
    to_torch, torch_or_skip,
)
from .ops import (
    BY_NAME, OPS, Case, Op, grad_leaves, params, ref_bce, ref_value_and_grads, ref_cross_entropy, ref_gelu, ref_log_softmax,
    ref_log_sum_exp, ref_mse, ref_relu, ref_sigmoid, ref_softmax, ref_tanh, rows, torch_args, torch_kwargs, tt_args,
)
from .refs import (
    FD_ATOL, FD_RTOL, assert_grad_close, fd_upstream, numeric_grads, reference_backend, torch_or_none,
)
from .strategies import (
    ANY, EDGES, EXPONENT, EXTREME, HUGE, MODERATE, NONZERO, phases, POSITIVE, PROBABILITY, UNIT, Domain, axis_specs,
    broadcast_pairs, incompatible_pairs, laid_out, layout, matmul_shapes, property_settings, shape_id, shapes,
)

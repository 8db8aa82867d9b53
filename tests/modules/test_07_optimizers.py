"""Module 07 (optimizers): the exported `tinytorch.core.optimizers` against `torch.optim`.

The central check: the same parameters (float32, drawn shapes, contiguous or not) start at the
same values in tinytorch and in PyTorch, receive the same gradients (of a fixed quadratic, computed
in NumPy from each framework's *current* parameters) for 50 steps, and must follow the same
trajectory within 1e-5 at every step. Hypothesis draws the hyperparameters (momentum, dampening,
Nesterov, weight decay, betas, eps), the shapes, the memory layouts, and which parameters get no
gradient on which step (they must be skipped, and Adam's per-parameter step counts must follow).
A small MLP trained with each optimizer in both frameworks, with each framework's own backward,
must also end at the same weights.

NumPy formulas are the reference where PyTorch is not needed (state memory, errors, in-place
updates). Without torch (a student edition) the same tests compare with the update rules in closed
form (`tests/support/refs.py`), so nothing skips.

Each test is marked with the exercise it checks: `pytest tests/modules/test_07_optimizers.py
--exercise 7.4` runs Adam's.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

from tinytorch.core.optimizers import SGD, Adam, AdamW, Optimizer
from tinytorch.core.tensor import Tensor
from tests.support import refs
from tests.support.refs import torch_or_none

pytestmark = pytest.mark.module("07")

PROPERTY = settings(max_examples=25, deadline=None)
STEPS = 50
RTOL, ATOL = 1e-5, 1e-5


# ---------------------------------------------------------------------------------------------
# Problems: parameters in drawn layouts, gradients of a fixed quadratic
# ---------------------------------------------------------------------------------------------
def layout_view(values: np.ndarray, layout: str) -> np.ndarray:
    """A float32 array equal to `values`, stored as asked: "c" contiguous, "t" a transposed view,
    "s" a strided view (every other element of a larger buffer)."""
    values = values.astype(np.float32)
    if layout == "t" and values.ndim >= 2:
        out = np.ascontiguousarray(values.T).T
        if not out.flags["C_CONTIGUOUS"]:  # a (1, 1) array is contiguous either way: stride it instead
            return out
    if layout in ("s", "t") and values.size > 0:
        base = np.zeros(values.shape[:-1] + (2 * values.shape[-1],), dtype=np.float32) if values.ndim else None
        if base is not None:
            out = base[..., ::2]
            out[...] = values
            return out
    return values.copy()


@st.composite
def quadratic_problem(draw, max_params=3):
    """Starting values, curvatures and centres of `sum(a * (p - c)^2) / 2` for 1..3 parameters,
    their layouts, and a skip table saying which parameter gets no gradient on which step."""
    n = draw(st.integers(1, max_params))
    shapes = [draw(array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)) for _ in range(n)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    starts = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    curvatures = [rng.uniform(0.1, 2.0, s).astype(np.float32) for s in shapes]
    # centres 1.5..2.5 away from the start in a random direction: Adam, which moves about lr per
    # step, stays far from the minimum, where a sign flip of a tiny gradient would decide its step
    centres = [(p + rng.choice([-1.0, 1.0], s) * rng.uniform(1.5, 2.5, s)).astype(np.float32)
               for p, s in zip(starts, shapes)]
    layouts = [draw(st.sampled_from(["c", "t", "s"])) for _ in range(n)]
    skip_rate = draw(st.sampled_from([0.0, 0.0, 0.3]))
    skip = rng.random((STEPS, n)) < skip_rate
    return starts, curvatures, centres, layouts, skip


@pytest.fixture(autouse=True, scope="module")
def _torch_on_one_thread():
    """PyTorch's CPU thread pool on a busy shared machine makes these tiny steps 100x slower: use one thread."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def quadratic_grad(p: np.ndarray, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.asarray(a * (p - c), dtype=np.float32)


def run_tinytorch(make_opt, problem, steps=STEPS):
    """Trajectory (list over steps of lists of arrays) of a tinytorch optimizer on `problem`."""
    starts, curvatures, centres, layouts, skip = problem
    params = [Tensor(layout_view(p, lay), requires_grad=True) for p, lay in zip(starts, layouts)]
    arrays = [p.data for p in params]
    opt = make_opt(params)
    trajectory = []
    for t in range(steps):
        for k, p in enumerate(params):
            g = quadratic_grad(p.data, curvatures[k], centres[k])
            p.grad = None if skip[t, k] else Tensor(layout_view(g, layouts[k]))
        opt.step()
        for k, p in enumerate(params):
            assert p.data is arrays[k], (
                f"step {t + 1}: parameter {k}'s .data is a new array; step() must update the array in place "
                f"(np.subtract(p.data, ..., out=p.data) or p.data -= ...)")
            assert p.grad_fn is None and p.is_leaf, f"step {t + 1}: parameter {k} became an op result; step() must not record a graph"
        trajectory.append([p.data.copy() for p in params])
    return trajectory, opt


def run_reference(rule: str, kw: dict, problem, steps=STEPS):
    """Without torch: the trajectory of the closed-form update rule (`tests/support/refs.py`) on
    `problem`, in float32 as torch.optim would compute it; returns (trajectory, reference optimizer)."""
    starts, curvatures, centres, _, skip = problem
    params = [p.astype(np.float32).copy() for p in starts]
    opt = refs.ReferenceOptimizer(rule, **kw)
    trajectory = []
    for t in range(steps):
        grads = [None if skip[t, k] else quadratic_grad(p, curvatures[k], centres[k]) for k, p in enumerate(params)]
        opt.step(params, grads)
        trajectory.append([p.copy() for p in params])
    return trajectory, opt


def run_torch(make_opt, problem, steps=STEPS):
    import torch

    starts, curvatures, centres, _, skip = problem
    params = [torch.tensor(p.copy(), requires_grad=True) for p in starts]
    opt = make_opt(params)
    trajectory = []
    for t in range(steps):
        for k, p in enumerate(params):
            g = quadratic_grad(p.detach().numpy(), curvatures[k], centres[k])
            p.grad = None if skip[t, k] else torch.from_numpy(g)
        opt.step()
        trajectory.append([p.detach().numpy().copy() for p in params])
    return trajectory


def assert_same_trajectory(ours, theirs, what: str):
    for t, (mine, ref) in enumerate(zip(ours, theirs)):
        for k, (a, b) in enumerate(zip(mine, ref)):
            assert a.shape == b.shape and a.dtype == np.float32, f"{what}: parameter {k} has shape {a.shape} dtype {a.dtype}"
            if not np.allclose(a, b, rtol=RTOL, atol=ATOL):
                worst = np.unravel_index(np.argmax(np.abs(a - b)), a.shape) if a.ndim else ()
                raise AssertionError(
                    f"{what}: step {t + 1}, parameter {k} (shape {a.shape}) differs from torch.optim at index "
                    f"{tuple(int(i) for i in worst)}: got {a[worst]!r}, torch has {b[worst]!r} "
                    f"(largest difference {np.abs(a - b).max():.3g}; tolerance {ATOL:g})")


def error_of(fn):
    "The exception fn() raises, or None; an unfinished stub's NotImplementedError propagates (it names the stub)."
    try:
        fn()
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return e
    return None


# =============================================================================================
# Exercise 7.1: Optimizer.__init__ and zero_grad
# =============================================================================================
@pytest.mark.exercise("7.1", "Optimizer.__init__")
@pytest.mark.parametrize("container", ["list", "tuple", "generator", "Module.parameters"])
def test_params_are_kept_in_a_list_in_order(container):
    from tinytorch.core.layers import Linear

    layer = Linear(3, 2, rng=0)
    source = {"list": lambda: list(layer.parameters()), "tuple": lambda: tuple(layer.parameters()),
              "generator": lambda: (p for p in layer.parameters()), "Module.parameters": layer.parameters}[container]
    for cls, kw in ((SGD, dict(lr=0.1)), (Adam, {}), (AdamW, {})):
        opt = cls(source(), **kw)
        assert isinstance(opt.params, list), f"{cls.__name__}.params is a {type(opt.params).__name__}; expected a list"
        assert len(opt.params) == 2 and opt.params[0] is layer.weight and opt.params[1] is layer.bias, (
            f"{cls.__name__} from a {container} must keep [weight, bias] themselves, in order")
        assert opt.state == {}, f"a new {cls.__name__} must start with empty state; got {opt.state}"


W = Tensor(np.ones((2, 3)), requires_grad=True)
B = Tensor(np.zeros(3), requires_grad=True)
BAD_PARAMS = [
    pytest.param(lambda: [], ValueError, ["empty parameter list"], id="empty-list"),
    pytest.param(lambda: iter([]), ValueError, ["empty parameter list"], id="empty-generator"),
    pytest.param(lambda: [W, np.ones(3)], TypeError, ["parameter 1", "ndarray"], id="ndarray-entry"),
    pytest.param(lambda: [W, 3.0], TypeError, ["parameter 1", "float"], id="float-entry"),
    pytest.param(lambda: [B, Tensor(np.ones(3))], ValueError, ["parameter 1", "requires_grad"], id="no-requires-grad"),
    pytest.param(lambda: [W, W * 2.0], ValueError, ["parameter 1", "leaf"], id="non-leaf"),
    pytest.param(lambda: [W, B, W], ValueError, ["parameter 2", "parameter 0"], id="duplicate"),
    pytest.param(lambda: W, TypeError, ["a list of Tensors"], id="single-tensor"),
    pytest.param(lambda: 7, TypeError, ["iterable"], id="not-iterable"),
]


@pytest.mark.exercise("7.1", "Optimizer.__init__")
@pytest.mark.parametrize("make, error, words", BAD_PARAMS)
@pytest.mark.parametrize("cls, kw", [(SGD, dict(lr=0.1)), (Adam, {}), (AdamW, {})], ids=["SGD", "Adam", "AdamW"])
def test_bad_parameter_lists_are_refused_clearly(make, error, words, cls, kw):
    e = error_of(lambda: cls(make(), **kw))
    assert isinstance(e, error), f"{cls.__name__}(<{make()!r:.60}>) must raise {error.__name__}; got {e!r}"
    for word in words:
        assert word in str(e), f"{cls.__name__}: the {error.__name__} must contain {word!r}; got: {e}"


@pytest.mark.exercise("7.1", "Optimizer.__init__")
def test_a_model_instead_of_its_parameters_is_refused():
    from tinytorch.core.layers import Linear, Sequential

    e = error_of(lambda: Adam(Sequential(Linear(2, 2, rng=0))))
    assert isinstance(e, TypeError) and "parameters()" in str(e), (
        f"Adam(model) must raise TypeError saying to pass model.parameters(); got {e!r}")


@pytest.mark.exercise("7.1", "Optimizer.zero_grad")
@PROPERTY
@given(shapes=st.lists(array_shapes(min_dims=0, max_dims=3, max_side=4), min_size=1, max_size=4),
       with_grad=st.lists(st.booleans(), min_size=4, max_size=4))
def test_zero_grad_sets_none_or_zeros_in_place(shapes, with_grad):
    params = [Tensor(np.ones(s), requires_grad=True) for s in shapes]
    for p, has in zip(params, with_grad):
        p.grad = Tensor(np.full(p.shape, 3.0)) if has else None
    held = [None if p.grad is None else (p.grad, p.grad.data) for p in params]
    opt = SGD(params, lr=0.1)
    opt.zero_grad(set_to_none=False)
    for k, (p, h) in enumerate(zip(params, held)):
        if h is None:
            assert p.grad is None, f"zero_grad(set_to_none=False): parameter {k} had no grad and must keep None"
        else:
            assert p.grad is h[0] and p.grad.data is h[1], f"zero_grad(set_to_none=False) must zero parameter {k}'s grad in place"
            assert np.all(p.grad.data == 0), f"zero_grad(set_to_none=False): parameter {k}'s grad is {p.grad.data}; expected zeros"
    opt.zero_grad()
    assert all(p.grad is None for p in params), "zero_grad() must set every .grad to None"
    assert all(np.all(p.data == 1) for p in params), "zero_grad() must not touch the parameters"


# =============================================================================================
# Exercise 7.2: state_dict and load_state_dict
# =============================================================================================
STATEFUL = [
    pytest.param(lambda ps: SGD(ps, lr=0.05, momentum=0.9, dampening=0.1), id="SGD-momentum"),
    pytest.param(lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), id="SGD-nesterov"),
    pytest.param(lambda ps: Adam(ps, lr=0.01, weight_decay=0.01), id="Adam"),
    pytest.param(lambda ps: AdamW(ps, lr=0.01, betas=(0.8, 0.99)), id="AdamW"),
]


def small_problem(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (4,), ()]
    starts = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    curvatures = [rng.uniform(0.1, 2.0, s).astype(np.float32) for s in shapes]
    centres = [(p + 2.0).astype(np.float32) for p in starts]
    skip = rng.random((40, 3)) < 0.25
    return starts, curvatures, centres, ["c", "t", "c"], skip


@pytest.mark.exercise("7.2", "Optimizer.load_state_dict")
@pytest.mark.parametrize("make", STATEFUL)
def test_resuming_from_a_state_dict_continues_exactly(make):
    problem = small_problem()
    straight, _ = run_tinytorch(make, problem, steps=20)
    first, opt = run_tinytorch(make, problem, steps=10)
    sd = opt.state_dict()
    starts, curvatures, centres, layouts, skip = problem
    resumed_problem = (first[-1], curvatures, centres, layouts, skip[10:])

    def make_loaded(ps):
        o = make(ps)
        o.load_state_dict(sd)
        return o

    resumed, _ = run_tinytorch(make_loaded, resumed_problem, steps=10)
    for k, (a, b) in enumerate(zip(resumed[-1], straight[-1])):
        np.testing.assert_array_equal(a, b, err_msg=f"parameter {k} after 10 + 10 steps resumed from state_dict() "
                                                    "must equal 20 uninterrupted steps exactly")


@pytest.mark.exercise("7.2", "Optimizer.state_dict")
@pytest.mark.parametrize("make", STATEFUL)
def test_state_dict_is_plain_data_and_a_snapshot(make):
    _, opt = run_tinytorch(make, small_problem(1), steps=5)
    sd = opt.state_dict()
    assert set(sd) == {"optimizer", "hyperparameters", "state"}, f"state_dict() keys: {sorted(sd)}"
    assert sd["optimizer"] == type(opt).__name__
    assert sd["hyperparameters"] == {n: getattr(opt, n) for n in opt.hyperparameter_names}
    assert sd["state"] and all(type(i) is int for i in sd["state"]), f"state keys must be int positions; got {list(sd['state'])}"
    arrays = {}
    for i, entry in sd["state"].items():
        for key, item in entry.items():
            if isinstance(item, np.ndarray):
                assert item.shape == opt.params[i].shape, f"state {key} of parameter {i}: shape {item.shape}"
                assert not np.shares_memory(item, opt.state[i][key]), f"state_dict() must copy {key} of parameter {i}"
                arrays[(i, key)] = item.copy()
            else:
                assert isinstance(item, (int, float)), f"state {key} of parameter {i} is a {type(item).__name__}; expected a number"
    # everything that is not an array must be JSON-serializable, as module 08 writes it
    json.dumps({"hyperparameters": sd["hyperparameters"],
                "state": {str(i): {n: v for n, v in e.items() if not isinstance(v, np.ndarray)} for i, e in sd["state"].items()}})
    for p in opt.params:
        p.grad = Tensor(np.ones(p.shape))
    opt.step()
    for (i, name), value in arrays.items():
        np.testing.assert_array_equal(sd["state"][i][name], value, err_msg="a state dict already taken changed when the optimizer stepped")


def adam_state_dict():
    _, opt = run_tinytorch(lambda ps: Adam(ps, lr=0.01), small_problem(2), steps=3)
    return opt.state_dict()


def fresh_adam(shapes=((3, 4), (4,), ())):
    return Adam([Tensor(np.zeros(s), requires_grad=True) for s in shapes], lr=0.5)


def with_state(sd, i, **changes):
    state = {k: dict(v) for k, v in sd["state"].items()}
    state[i].update(changes)
    return {**sd, "state": state}


BAD_STATE = [
    pytest.param(lambda sd: {**sd, "optimizer": "SGD"}, ["SGD", "Adam"], id="other-optimizer"),
    pytest.param(lambda sd: {k: v for k, v in sd.items() if k != "state"}, ["state"], id="missing-key"),
    pytest.param(lambda sd: {**sd, "hyperparameters": {**sd["hyperparameters"], "lr": -1.0}}, ["lr", "-1.0"], id="negative-lr"),
    pytest.param(lambda sd: {**sd, "hyperparameters": {**sd["hyperparameters"], "momentum": 0.9}}, ["momentum"], id="unknown-hyperparameter"),
    pytest.param(lambda sd: with_state(sd, 0, exp_avg=np.zeros((4, 3))), ["parameter 0", "(4, 3)", "(3, 4)"], id="transposed-state"),
    pytest.param(lambda sd: with_state(sd, 1, exp_avg_sq=np.zeros(5)), ["parameter 1", "(5,)", "(4,)"], id="wrong-length"),
    pytest.param(lambda sd: with_state(sd, 0, momentum_buffer=np.zeros((3, 4))), ["momentum_buffer"], id="unknown-state"),
    pytest.param(lambda sd: {**sd, "state": {**sd["state"], 7: sd["state"][0]}}, ["7", "3"], id="position-out-of-range"),
    pytest.param(lambda sd: {**sd, "state": {"weight": sd["state"][0]}}, ["'weight'", "positions"], id="named-key"),
    pytest.param(lambda sd: {**sd, "state": [sd["state"][0]]}, ["state", "dict"], id="state-not-a-dict"),
    pytest.param(lambda sd: {**sd, "state": {0: None}}, ["parameter 0", "dict"], id="entry-not-a-dict"),
]


@pytest.mark.exercise("7.2", "Optimizer.load_state_dict")
@pytest.mark.parametrize("corrupt, words", BAD_STATE)
def test_bad_state_dicts_are_refused_and_change_nothing(corrupt, words):
    sd = adam_state_dict()
    opt = fresh_adam()
    e = error_of(lambda: opt.load_state_dict(corrupt(sd)))
    assert isinstance(e, ValueError), f"load_state_dict of a bad state dict must raise ValueError; got {e!r}"
    for word in words:
        assert word in str(e), f"the error must contain {word!r}; got: {e}"
    assert opt.state == {} and opt.lr == 0.5, "a refused state dict must leave the optimizer unchanged"


@pytest.mark.exercise("7.2", "Optimizer.load_state_dict")
def test_load_accepts_what_a_json_and_npz_round_trip_gives_back():
    sd = adam_state_dict()
    text = json.dumps({"optimizer": sd["optimizer"], "hyperparameters": sd["hyperparameters"],
                       "steps": {str(i): e["step"] for i, e in sd["state"].items()}})
    back = json.loads(text)
    state = {i: {"step": np.int64(back["steps"][i]),
                 "exp_avg": sd["state"][int(i)]["exp_avg"].astype(np.float64),
                 "exp_avg_sq": sd["state"][int(i)]["exp_avg_sq"]} for i in back["steps"]}
    opt = fresh_adam()
    opt.load_state_dict({"optimizer": back["optimizer"], "hyperparameters": back["hyperparameters"], "state": state})
    assert opt.betas == tuple(sd["hyperparameters"]["betas"]) and opt.lr == sd["hyperparameters"]["lr"]
    for i, entry in sd["state"].items():
        assert type(opt.state[i]["step"]) is int and opt.state[i]["step"] == entry["step"], (
            f"step of parameter {i} must come back as the Python int {entry['step']}; got {opt.state[i]['step']!r}")
        assert opt.state[i]["exp_avg"].dtype == np.float32, "restored arrays must take the parameter's dtype"
        np.testing.assert_allclose(opt.state[i]["exp_avg"], entry["exp_avg"], rtol=1e-7)


# =============================================================================================
# Exercise 7.3: SGD.step
# =============================================================================================
@pytest.mark.exercise("7.3", "SGD.step")
@PROPERTY
@given(problem=quadratic_problem(), lr=st.floats(1e-3, 0.1), momentum=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
       dampening=st.sampled_from([0.0, 0.0, 0.1, 0.5]), nesterov=st.booleans(),
       weight_decay=st.sampled_from([0.0, 1e-4, 0.1]))
def test_sgd_follows_torch_for_50_steps(problem, lr, momentum, dampening, nesterov, weight_decay):
    torch = torch_or_none()
    if nesterov and (momentum == 0 or dampening != 0):
        nesterov = False
    kw = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
    ours, opt = run_tinytorch(lambda ps: SGD(ps, **kw), problem)
    theirs = run_reference("SGD", kw, problem)[0] if torch is None else \
        run_torch(lambda ps: torch.optim.SGD(ps, **kw), problem)
    assert_same_trajectory(ours, theirs, f"SGD({', '.join(f'{k}={v}' for k, v in kw.items())})")
    if momentum == 0:
        assert opt.state == {}, f"SGD without momentum keeps no state; got {list(opt.state)}"


@pytest.mark.exercise("7.3", "SGD.step")
def test_sgd_momentum_buffer_matches_torch_state():
    torch = torch_or_none()
    problem = small_problem(3)
    kw = dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01)
    _, ours = run_tinytorch(lambda ps: SGD(ps, **kw), problem, steps=7)
    if torch is None:
        ref = run_reference("SGD", kw, problem, steps=7)[1].state
    else:
        made = []
        run_torch(lambda ps: made.append(torch.optim.SGD(ps, **kw)) or made[0], problem, steps=7)
        ref = {i: {k: np.asarray(v) for k, v in e.items()} for i, e in made[0].state_dict()["state"].items()}
    assert sorted(ours.state) == sorted(ref), f"parameters with state: {sorted(ours.state)}; torch has {sorted(ref)}"
    for i in ref:
        np.testing.assert_allclose(ours.state[i]["momentum_buffer"], ref[i]["momentum_buffer"], rtol=RTOL, atol=ATOL,
                                   err_msg=f"momentum_buffer of parameter {i} after 7 steps")


@pytest.mark.exercise("7.3", "SGD.step")
def test_sgd_constant_gradient_closed_form():
    # buf_t = g (1 - mu^t) / (1 - mu) without dampening; p_t = -lr * sum of buffers
    mu, lr, g = 0.9, 0.01, np.float32(2.0)
    w = Tensor(np.zeros(4), requires_grad=True)
    opt = SGD([w], lr=lr, momentum=mu)
    for t in range(1, 31):
        w.grad = Tensor(np.full(4, g))
        opt.step()
    expected = -lr * g * sum((1 - mu ** k) / (1 - mu) for k in range(1, 31))
    np.testing.assert_allclose(w.data, expected, rtol=1e-5,
                               err_msg="30 momentum steps on a constant gradient: -lr * g * sum_k (1 - mu^k) / (1 - mu)")


@pytest.mark.exercise("7.3", "SGD.step")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_keeps_dtype_and_leaves_grad_alone(dtype):
    w = Tensor(np.ones((3, 2)), dtype=dtype, requires_grad=True)
    g = np.arange(6, dtype=dtype).reshape(3, 2)
    w.grad = Tensor(g.copy(), dtype=dtype)
    opt = SGD([w], lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True)
    opt.step()
    opt.step()
    assert w.dtype == dtype and opt.state[0]["momentum_buffer"].dtype == dtype, (
        f"{np.dtype(dtype)} parameters: got parameter {w.dtype}, buffer {opt.state[0]['momentum_buffer'].dtype}")
    np.testing.assert_array_equal(w.grad.data, g, err_msg="step() must not modify p.grad")


@pytest.mark.exercise("7.3", "SGD.step")
def test_sgd_names_a_gradient_of_the_wrong_shape():
    w = Tensor(np.ones((2, 3)), requires_grad=True)
    w.grad = Tensor(np.ones((3, 2)))
    e = error_of(SGD([w], lr=0.1).step)
    assert isinstance(e, ValueError) and "(2, 3)" in str(e) and "(3, 2)" in str(e), (
        f"a (3, 2) gradient for a (2, 3) parameter must raise ValueError naming both shapes; got {e!r}")


SGD_BAD = [
    (dict(lr=-0.1), ValueError, ["lr", "-0.1"]),
    (dict(lr=float("nan")), ValueError, ["lr"]),
    (dict(lr="0.1"), TypeError, ["lr"]),
    (dict(lr=0.1, momentum=-0.5), ValueError, ["momentum", "-0.5"]),
    (dict(lr=0.1, momentum=1.0), ValueError, ["momentum", "1.0"]),
    (dict(lr=0.1, momentum=0.9, dampening=1.5), ValueError, ["dampening", "1.5"]),
    (dict(lr=0.1, weight_decay=-1e-4), ValueError, ["weight_decay"]),
    (dict(lr=0.1, nesterov=True), ValueError, ["Nesterov", "momentum"]),
    (dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), ValueError, ["Nesterov", "dampening"]),
]


@pytest.mark.exercise("7.3", "SGD.step")
@pytest.mark.parametrize("kw, error, words", SGD_BAD, ids=[str(k) for k, _, _ in SGD_BAD])
def test_sgd_bad_hyperparameters_are_named(kw, error, words):
    e = error_of(lambda: SGD([Tensor(np.ones(2), requires_grad=True)], **kw))
    assert isinstance(e, error), f"SGD(..., {kw}) must raise {error.__name__}; got {e!r}"
    for word in words:
        assert word in str(e), f"SGD(..., {kw}): the error must contain {word!r}; got: {e}"


# =============================================================================================
# Exercise 7.4: Adam.step
# =============================================================================================
@pytest.mark.exercise("7.4", "Adam.step")
@PROPERTY
@given(problem=quadratic_problem(), lr=st.floats(1e-4, 0.01), beta1=st.sampled_from([0.0, 0.5, 0.9]),
       beta2=st.sampled_from([0.9, 0.99, 0.999]), eps=st.sampled_from([1e-8, 1e-6, 1e-3]),
       weight_decay=st.sampled_from([0.0, 0.0, 1e-2, 0.1]))
def test_adam_follows_torch_for_50_steps(problem, lr, beta1, beta2, eps, weight_decay):
    torch = torch_or_none()
    kw = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    ours, _ = run_tinytorch(lambda ps: Adam(ps, **kw), problem)
    theirs = run_reference("Adam", kw, problem)[0] if torch is None else \
        run_torch(lambda ps: torch.optim.Adam(ps, **kw), problem)
    assert_same_trajectory(ours, theirs, f"Adam({', '.join(f'{k}={v}' for k, v in kw.items())})")


@pytest.mark.exercise("7.4", "Adam.step")
def test_adam_state_matches_torch_state():
    torch = torch_or_none()
    problem = small_problem(4)
    kw = dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.05)
    _, ours = run_tinytorch(lambda ps: Adam(ps, **kw), problem, steps=9)
    if torch is None:
        ref = run_reference("Adam", kw, problem, steps=9)[1].state
    else:
        made = []
        run_torch(lambda ps: made.append(torch.optim.Adam(ps, **kw)) or made[0], problem, steps=9)
        ref = {i: {k: np.asarray(v) for k, v in e.items()} for i, e in made[0].state_dict()["state"].items()}
    assert sorted(ours.state) == sorted(ref), f"parameters with state: {sorted(ours.state)}; torch has {sorted(ref)}"
    for i in ref:
        assert ours.state[i]["step"] == int(ref[i]["step"]), (
            f"parameter {i} took {int(ref[i]['step'])} steps with a gradient (torch); state['step'] is {ours.state[i]['step']}")
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(ours.state[i][name], ref[i][name], rtol=RTOL, atol=1e-7,
                                       err_msg=f"{name} of parameter {i} after 9 steps")


@pytest.mark.exercise("7.4", "Adam.step")
@PROPERTY
@given(scale=st.sampled_from([1e-4, 1e-2, 1.0, 1e2, 1e4]), lr=st.floats(1e-4, 0.1), seed=st.integers(0, 1000))
def test_adam_first_step_is_lr_times_sign_whatever_the_scale(scale, lr, seed):
    g = np.random.default_rng(seed).standard_normal((5, 3)).astype(np.float32) * np.float32(scale)
    w = Tensor(np.zeros((5, 3)), requires_grad=True)
    w.grad = Tensor(g)
    Adam([w], lr=lr).step()
    expected = -lr * g.astype(np.float64) / (np.abs(g) + 1e-8)  # lr * sign(g), but for eps
    np.testing.assert_allclose(w.data, expected, rtol=1e-5, atol=1e-7,
                               err_msg=f"Adam's first step is lr * g / (|g| + eps), about lr * sign(g), for gradients "
                                       f"of scale {scale:g}: check the bias corrections 1 - beta ** t")


ADAM_BAD = [
    (Adam, dict(lr=-1e-3), ["lr"]),
    (Adam, dict(betas=(1.0, 0.999)), ["betas[0]", "1.0"]),
    (Adam, dict(betas=(0.9, 1.5)), ["betas[1]", "1.5"]),
    (Adam, dict(betas=(-0.1, 0.999)), ["betas[0]", "-0.1"]),
    (Adam, dict(betas=(0.9,)), ["betas", "pair"]),
    (Adam, dict(eps=-1e-8), ["eps"]),
    (Adam, dict(weight_decay=-0.1), ["weight_decay"]),
    (AdamW, dict(lr=-1.0), ["AdamW", "lr"]),
    (AdamW, dict(betas=(0.9, 1.0)), ["AdamW", "betas[1]"]),
]


@pytest.mark.exercise("7.4", "Adam.step")
@pytest.mark.parametrize("cls, kw, words", ADAM_BAD, ids=[f"{c.__name__}-{k}" for c, k, _ in ADAM_BAD])
def test_adam_bad_hyperparameters_are_named(cls, kw, words):
    e = error_of(lambda: cls([Tensor(np.ones(2), requires_grad=True)], **kw))
    assert isinstance(e, ValueError), f"{cls.__name__}(..., {kw}) must raise ValueError; got {e!r}"
    for word in words:
        assert word in str(e), f"{cls.__name__}(..., {kw}): the error must contain {word!r}; got: {e}"


# =============================================================================================
# Exercise 7.5: AdamW.step
# =============================================================================================
@pytest.mark.exercise("7.5", "AdamW.step")
@PROPERTY
@given(problem=quadratic_problem(), lr=st.floats(1e-4, 0.01), betas=st.sampled_from([(0.9, 0.999), (0.5, 0.9)]),
       weight_decay=st.sampled_from([0.0, 1e-2, 0.1, 1.0]))
def test_adamw_follows_torch_for_50_steps(problem, lr, betas, weight_decay):
    torch = torch_or_none()
    kw = dict(lr=lr, betas=betas, weight_decay=weight_decay)
    ours, _ = run_tinytorch(lambda ps: AdamW(ps, **kw), problem)
    theirs = run_reference("AdamW", kw, problem)[0] if torch is None else \
        run_torch(lambda ps: torch.optim.AdamW(ps, **kw), problem)
    assert_same_trajectory(ours, theirs, f"AdamW({', '.join(f'{k}={v}' for k, v in kw.items())})")


@pytest.mark.exercise("7.5", "AdamW.step")
def test_adamw_decay_is_decoupled_from_the_gradient():
    lr, wd = 0.01, 0.5
    w = Tensor(np.full(3, 2.0), requires_grad=True)
    opt = AdamW([w], lr=lr, weight_decay=wd)
    for _ in range(20):
        w.grad = Tensor(np.zeros(3))
        opt.step()
    np.testing.assert_allclose(w.data, 2.0 * (1 - lr * wd) ** 20, rtol=1e-6,
                               err_msg="with zero gradients AdamW only decays: p * (1 - lr * wd) ** steps")
    assert np.all(opt.state[0]["exp_avg"] == 0), "AdamW must not put weight decay into exp_avg"
    a = Tensor(np.full(3, 2.0), requires_grad=True)
    l2 = Adam([a], lr=lr, weight_decay=wd)
    a.grad = Tensor(np.zeros(3))
    l2.step()
    np.testing.assert_allclose(a.data, 2.0 - lr, rtol=1e-5,
                               err_msg="Adam's L2 weight decay, by contrast, enters the gradient: first step lr * sign(wd * p)")


@pytest.mark.exercise("7.5", "AdamW.step")
def test_adamw_skips_parameters_without_gradients():
    w = Tensor(np.ones(2), requires_grad=True)
    frozen = Tensor(np.ones(2), requires_grad=True)
    opt = AdamW([w, frozen], lr=0.1, weight_decay=0.5)
    w.grad = Tensor(np.ones(2))
    opt.step()
    np.testing.assert_array_equal(frozen.data, 1.0, err_msg="a parameter whose grad is None is neither decayed nor updated")
    assert list(opt.state) == [0], f"only parameter 0 had a gradient; state keys {list(opt.state)}"


# =============================================================================================
# A small MLP trained in both frameworks, each with its own backward
# =============================================================================================
MLP_CASES = [
    pytest.param("SGD", dict(lr=0.1), marks=pytest.mark.exercise("7.3", "SGD.step"), id="SGD"),
    pytest.param("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                 marks=pytest.mark.exercise("7.3", "SGD.step"), id="SGD-nesterov"),
    pytest.param("Adam", dict(lr=1e-2, weight_decay=1e-3), marks=pytest.mark.exercise("7.4", "Adam.step"), id="Adam"),
    pytest.param("AdamW", dict(lr=1e-2, weight_decay=0.1), marks=pytest.mark.exercise("7.5", "AdamW.step"), id="AdamW"),
]


@pytest.mark.parametrize("name, kw", MLP_CASES)
def test_mlp_training_matches_torch(name, kw):
    torch = torch_or_none()
    from tinytorch.core.activations import Tanh
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.losses import CrossEntropyLoss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = rng.integers(0, 4, 32)
    ours = Sequential(Linear(6, 16, rng=1), Tanh(), Linear(16, 4, rng=2))
    if torch is None:  # each step against the closed-form rule applied to our own gradients (checked in module 06)
        opt, ref, loss_fn = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}[name](ours.parameters(), **kw), \
            refs.ReferenceOptimizer(name, **kw), CrossEntropyLoss()
        for step in range(STEPS):
            opt.zero_grad()
            loss = loss_fn(ours(Tensor(x)), Tensor(y))
            loss.backward()
            expected = [p.data.copy() for p in ours.parameters()]
            ref.step(expected, [p.grad.data.copy() for p in ours.parameters()])
            opt.step()
            for k, (p, e) in enumerate(zip(ours.parameters(), expected)):
                np.testing.assert_allclose(p.data, e, rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name}({kw}): parameter {k} after training step {step + 1} "
                                                   "vs the closed-form update rule")
        assert loss.item() < 0.9 * math.log(4), f"{name} should have reduced the loss below log(4); got {loss.item():.3f}"
        return
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            q.copy_(torch.from_numpy(p.data.copy()))
    opt = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}[name](ours.parameters(), **kw)
    ref = getattr(torch.optim, name)(theirs.parameters(), **kw)
    loss_fn, tx, ty = CrossEntropyLoss(), torch.from_numpy(x), torch.from_numpy(y)
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(ours(Tensor(x)), Tensor(y))
        loss.backward()
        opt.step()
        ref.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(theirs(tx), ty)
        ref_loss.backward()
        ref.step()
        assert abs(loss.item() - ref_loss.item()) < 1e-4, f"{name}: loss at step {step + 1} {loss.item()} vs torch {ref_loss.item()}"
    for k, (p, q) in enumerate(zip(ours.parameters(), theirs.parameters())):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name}({kw}): parameter {k} after {STEPS} training steps vs torch.optim")
    assert loss.item() < 0.9 * math.log(4), f"{name} should have reduced the loss below log(4); got {loss.item():.3f}"

"""Module 03 (layers): the exported `tinytorch.core.layers` checked against NumPy references.

- Parameter discovery, dotted names and train/eval are checked on small modules built by hand from
  Tensors, so they only depend on `Module`.
- `Linear` is compared with `x @ W.T + b` computed in NumPy (float64) on shapes drawn by hypothesis,
  including extra leading dimensions and transposed (non-contiguous) inputs.
- The initializers are checked statistically on large layers: Xavier `Var = 2/(fan_in + fan_out)`,
  Kaiming `Var = 2/fan_in`, within 5 %.
- `Dropout` is checked statistically (drop rate, 1/(1-p) scaling, kept mean), for eval identity and
  for seed reproducibility.
- `Sequential` is checked with plain functions (not module 02's activations), so that a failure
  here points at module 03.

Run one exercise with `pytest tests/modules/test_03_layers.py --exercise 3.6`.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.layers import (
    Dropout, Linear, Module, Sequential, as_generator, fan_in_fan_out, kaiming_normal, xavier_uniform,
)
from tests.support import assert_close, layout
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("03")

PROPERTY = settings(max_examples=40, deadline=None)
RTOL, ATOL = 1e-4, 1e-5


# ---------------------------------------------------------------------------------------------
# Small modules built by hand (no Linear needed)
# ---------------------------------------------------------------------------------------------
def param(*shape) -> Tensor:
    return Tensor(np.ones(shape, dtype=np.float32), requires_grad=True)


class Leaf(Module):
    def __init__(self, n=2):
        super().__init__()
        self.w = param(n, n)
        self.buffer = Tensor(np.zeros(n))       # requires_grad=False: not a parameter
        self.scale = 3.0
        self.name = "leaf"
        self.rng = np.random.default_rng(0)


class Tree(Module):
    def __init__(self):
        super().__init__()
        self.first = Leaf(2)
        self.blocks = [Leaf(3), abs, Leaf(4)]   # `abs`: a plain callable, ignored
        self.pair = (param(1), Leaf(1))
        self.b = param(2)


class NoSuperInit(Module):
    "A subclass that forgets super().__init__(): discovery and modes must still work."

    def __init__(self):
        self.w = param(2)


def names(module, **kw) -> list[str]:
    return [name for name, _ in module.named_parameters(**kw)]


# ---------------------------------------------------------------------------------------------
# Exercise 3.1-3.3: Module
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("3.1", "Module.named_children")
def test_named_children_finds_modules_parameters_and_list_items():
    tree = Tree()
    got = [name for name, _ in tree.named_children()]
    expected = ["first", "blocks.0", "blocks.2", "pair.0", "pair.1", "b"]
    assert got == expected, f"Tree().named_children() gave {got}; expected {expected}"
    members = dict(tree.named_children())
    assert members["blocks.2"] is tree.blocks[2] and members["b"] is tree.b, \
        "named_children() must yield the objects themselves, not copies"


@pytest.mark.exercise("3.1", "Module.named_children")
def test_named_children_ignores_non_parameters():
    got = [name for name, _ in Leaf().named_children()]
    assert got == ["w"], (f"Leaf().named_children() gave {got}; expected ['w'] (a Tensor without requires_grad, "
                          "a float, a string and a Generator are not members)")


@pytest.mark.exercise("3.1", "Module.named_children")
def test_named_children_counts_only_leaf_tensors_as_parameters():
    class Cache(Module):
        def __init__(self):
            super().__init__()
            self.w = param(2)
            self.activation = self.w * 2          # an op result (has a grad_fn): not a parameter
            self.detached = self.activation.detach()  # a leaf without requires_grad: not a parameter
            self.history = [self.w + 1, param(3)]

    got = [name for name, _ in Cache().named_children()]
    assert got == ["w", "history.1"], (
        f"named_children() gave {got}; expected ['w', 'history.1']: a stored op result has a grad_fn and is not "
        f"a leaf, so it is not a parameter (Tensor.is_leaf)")


@pytest.mark.exercise("3.2", "Module.named_parameters")
def test_named_parameters_dotted_names_in_definition_order():
    got = names(Tree())
    expected = ["first.w", "blocks.0.w", "blocks.2.w", "pair.0", "pair.1.w", "b"]
    assert got == expected, f"named_parameters() gave {got}; expected {expected}"


@pytest.mark.exercise("3.2", "Module.named_parameters")
def test_named_parameters_prefix_and_nesting():
    class Outer(Module):
        def __init__(self):
            super().__init__()
            self.encoder = Tree()
            self.head = [Leaf(2)]

    got = names(Outer(), prefix="model")
    assert got[0] == "model.encoder.first.w" and got[-1] == "model.head.0.w", \
        f"named_parameters(prefix='model') gave {got}; expected 'model.encoder.first.w' ... 'model.head.0.w'"
    assert len(got) == 7, f"Outer has 7 parameters; named_parameters() gave {len(got)}: {got}"


@pytest.mark.exercise("3.2", "Module.named_parameters")
def test_parameters_are_the_tensors_each_once():
    tree = Tree()
    tree.blocks.append(tree.first)            # the same module reachable twice
    tree.blocks[2].w = tree.first.w           # weight tying: one tensor in two modules
    params = tree.parameters()
    got = names(tree)
    assert got == ["first.w", "blocks.0.w", "pair.0", "pair.1.w", "b"], \
        f"shared modules and tensors must be listed once, under their first name; got {got}"
    assert len({id(p) for p in params}) == len(params), "parameters() returned a tensor twice"
    assert params[0] is tree.first.w, "parameters() must return the parameter tensors themselves"
    assert all(isinstance(p, Tensor) and p.requires_grad for p in params), \
        "every parameter is a Tensor with requires_grad=True"
    assert tree.num_parameters() == sum(p.size for p in params)


@pytest.mark.exercise("3.2", "Module.named_parameters")
def test_subclass_without_super_init_still_works():
    m = NoSuperInit()
    assert names(m) == ["w"], f"named_parameters() of a module without super().__init__() gave {names(m)}"
    assert m.training is True, "a module starts in training mode even without super().__init__()"


@pytest.mark.exercise("3.3", "Module.train")
def test_train_and_eval_reach_every_submodule():
    tree = Tree()
    every = lambda: [tree.training, tree.first.training, tree.blocks[0].training,  # noqa: E731
                     tree.blocks[2].training, tree.pair[1].training]
    assert every() == [True] * 5, f"new modules start in training mode; got {every()}"
    assert tree.eval() is tree, "eval() must return the module itself"
    assert every() == [False] * 5, f"eval() must reach every submodule, lists and tuples included; got {every()}"
    assert tree.train() is tree, "train() must return the module itself"
    assert every() == [True] * 5, f"train() must reach every submodule; got {every()}"
    tree.train(False)
    assert every() == [False] * 5, f"train(False) is eval(); got {every()}"


def test_base_module_forward_is_abstract_and_call_dispatches():
    class Double(Module):
        def forward(self, x, factor=2):
            return x * factor

    assert np.allclose(Double()(Tensor([1.0, 2.0]), factor=3).data, [3.0, 6.0]), "__call__ must pass args to forward"
    with pytest.raises(NotImplementedError, match="forward"):
        Module()(Tensor([1.0]))


# ---------------------------------------------------------------------------------------------
# Exercise 3.4: initialization
# ---------------------------------------------------------------------------------------------
def test_as_generator_and_fans():
    g = np.random.default_rng(0)
    assert as_generator(g) is g, "a Generator is used as it is"
    assert as_generator(5).random() == np.random.default_rng(5).random(), "an int is a seed"
    assert isinstance(as_generator(None), np.random.Generator)
    with pytest.raises(TypeError):
        as_generator("seed")
    assert fan_in_fan_out((3, 4)) == (4, 3)
    assert fan_in_fan_out((8, 3, 5, 5)) == (75, 200)


@pytest.mark.exercise("3.4", "xavier_uniform")
@pytest.mark.parametrize("shape", [(256, 1024), (1000, 300), (64, 32, 3, 3)])
def test_xavier_uniform_statistics(shape):
    w = xavier_uniform(shape, rng=0)
    receptive = int(np.prod(shape[2:]))  # computed here, not with the helper the solution uses
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    bound, var = np.sqrt(6 / (fan_in + fan_out)), 2 / (fan_in + fan_out)
    assert w.shape == shape and w.dtype == np.float32, f"xavier_uniform{shape}: got {w.shape} {w.dtype}; expected {shape} float32"
    assert np.abs(w).max() <= bound * (1 + 1e-6), f"Xavier weights must lie within +-{bound:.5f}; max |w| = {np.abs(w).max():.5f}"
    assert np.abs(w).max() > 0.95 * bound, f"Xavier weights should fill [-a, a], a = {bound:.5f}; max |w| = {np.abs(w).max():.5f}"
    assert abs(w.var() / var - 1) < 0.05, f"Var(w) = {w.var():.3e}; expected 2/(fan_in+fan_out) = {var:.3e} within 5%"
    assert abs(w.mean()) < 0.05 * np.sqrt(var), f"mean(w) = {w.mean():.3e}; expected about 0"


@pytest.mark.exercise("3.4", "kaiming_normal")
@pytest.mark.parametrize("shape", [(256, 1024), (1000, 300), (64, 32, 3, 3)])
def test_kaiming_normal_statistics(shape):
    w = kaiming_normal(shape, rng=0)
    fan_in = shape[1] * int(np.prod(shape[2:]))
    var = 2 / fan_in
    assert w.shape == shape and w.dtype == np.float32, f"kaiming_normal{shape}: got {w.shape} {w.dtype}; expected {shape} float32"
    assert abs(w.var() / var - 1) < 0.05, f"Var(w) = {w.var():.3e}; expected 2/fan_in = {var:.3e} within 5%"
    assert abs(w.mean()) < 0.05 * np.sqrt(var), f"mean(w) = {w.mean():.3e}; expected about 0"
    # A normal distribution, not a uniform one: about 31.7% of the values lie beyond one std.
    beyond = float((np.abs(w) > np.sqrt(var)).mean())
    assert abs(beyond - 0.317) < 0.02, f"{beyond:.3f} of the weights lie beyond one std; a normal distribution has 0.317"


@pytest.mark.exercise("3.4", "xavier_uniform")
def test_initializers_are_reproducible_and_use_the_generator():
    for init in (xavier_uniform, kaiming_normal):
        assert np.array_equal(init((5, 7), rng=3), init((5, 7), rng=3)), f"{init.__name__}: the same seed must give the same weights"
        assert not np.array_equal(init((5, 7), rng=3), init((5, 7), rng=4)), f"{init.__name__}: different seeds must differ"
        g = np.random.default_rng(0)
        assert not np.array_equal(init((5, 7), rng=g), init((5, 7), rng=g)), \
            f"{init.__name__}: a Generator passed in must be advanced, not reseeded"


# ---------------------------------------------------------------------------------------------
# Exercise 3.5-3.6: Linear
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("3.5", "Linear.__init__")
def test_linear_parameters_shapes_and_names():
    layer = Linear(5, 3, rng=0)
    assert layer.weight.shape == (3, 5), f"Linear(5, 3).weight.shape is {layer.weight.shape}; expected (3, 5) = (out, in)"
    assert layer.bias.shape == (3,) and np.all(layer.bias.data == 0), f"the bias has shape (3,) and starts at 0; got {layer.bias}"
    assert layer.weight.dtype == np.float32 and layer.bias.dtype == np.float32, "parameters are float32"
    assert layer.weight.requires_grad and layer.bias.requires_grad, "parameters need requires_grad=True"
    assert names(layer) == ["weight", "bias"], f"named_parameters() gave {names(layer)}; expected ['weight', 'bias']"
    assert layer.num_parameters() == 5 * 3 + 3
    no_bias = Linear(5, 3, bias=False)
    assert no_bias.bias is None and names(no_bias) == ["weight"], "bias=False: no bias parameter"


@pytest.mark.exercise("3.5", "Linear.__init__")
@pytest.mark.parametrize("init, expected_var", [("kaiming", 2 / 800), ("xavier", 2 / (800 + 600))])
def test_linear_init_statistics(init, expected_var):
    w = Linear(800, 600, init=init, rng=0).weight.data
    assert abs(w.var() / expected_var - 1) < 0.05, \
        f"Linear(800, 600, init={init!r}): Var(W) = {w.var():.3e}; expected {expected_var:.3e} within 5%"


@pytest.mark.exercise("3.5", "Linear.__init__")
def test_linear_default_init_is_kaiming_and_seedable():
    assert np.array_equal(Linear(6, 4, rng=1).weight.data, kaiming_normal((4, 6), rng=1)), \
        "the default init is Kaiming: Linear(6, 4, rng=1) should equal kaiming_normal((4, 6), rng=1)"
    assert np.array_equal(Linear(6, 4, init="xavier", rng=1).weight.data, xavier_uniform((4, 6), rng=1))
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    a, b = [Linear(6, 4, rng=g1) for _ in range(2)], [Linear(6, 4, rng=g2) for _ in range(2)]
    assert np.array_equal(a[1].weight.data, b[1].weight.data), "equal generators give equal layer sequences"
    assert not np.array_equal(a[0].weight.data, a[1].weight.data), "a shared generator gives each layer new weights"


@pytest.mark.exercise("3.5", "Linear.__init__")
@pytest.mark.parametrize("kwargs", [dict(init="normal"), dict(in_features=0), dict(out_features=-2),
                                    dict(in_features=2.5)])
def test_linear_rejects_bad_arguments(kwargs):
    args = {"in_features": 4, "out_features": 3, **kwargs}
    with pytest.raises(ValueError) as err:
        Linear(**args)
    bad = next(iter(kwargs.values()))
    assert repr(bad) in str(err.value) or str(bad) in str(err.value), f"the error should name the bad value {bad!r}; got: {err.value}"


@st.composite
def linear_case(draw):
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    fin, fout = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    bias = draw(st.booleans())
    transposed = draw(st.booleans()) and len(lead) >= 1
    seed = draw(st.integers(0, 2**16))
    return tuple(lead), fin, fout, bias, transposed, seed


@pytest.mark.exercise("3.6", "Linear.forward")
@PROPERTY
@given(linear_case())
def test_linear_forward_matches_numpy(case):
    lead, fin, fout, bias, transposed, seed = case
    rng = np.random.default_rng(seed)
    layer = Linear(fin, fout, bias=bias, rng=seed)
    if bias:
        layer.bias.data[:] = rng.standard_normal(fout)
    if transposed:   # a non-contiguous input: the transpose of a (fin, ..., lead[0]) array
        base = rng.standard_normal((fin,) + lead[1:] + (lead[0],)).astype(np.float32)
        x = np.swapaxes(base, 0, -1)
    else:
        x = rng.standard_normal(lead + (fin,)).astype(np.float32)
    y = layer(Tensor(x))
    ref = x.astype(np.float64) @ layer.weight.data.T.astype(np.float64)
    if bias:
        ref = ref + layer.bias.data
    assert isinstance(y, Tensor), f"Linear.forward returned {type(y).__name__}; expected a Tensor"
    assert y.shape == lead + (fout,), f"Linear({fin}, {fout}) on input {x.shape} gave shape {y.shape}; expected {lead + (fout,)}"
    assert y.dtype == np.float32, f"Linear.forward output dtype {y.dtype}; expected float32"
    assert_close(y, ref, op="Linear.forward", what=f"Linear({fin}, {fout}, bias={bias}) on input [{layout(x)}]",
                 rtol=RTOL, atol=ATOL, reference="x @ W.T + b in float64 NumPy")


@pytest.mark.exercise("3.6", "Linear.forward")
def test_linear_forward_accepts_arrays_and_does_not_change_its_input():
    layer = Linear(3, 2, rng=0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = x.copy()
    y = layer(x)
    assert isinstance(y, Tensor) and y.shape == (2, 2), f"Linear on a NumPy array gave {type(y).__name__} {getattr(y, 'shape', None)}"
    assert np.array_equal(x, before), "Linear.forward must not modify its input"


@pytest.mark.exercise("3.6", "Linear.forward")
@pytest.mark.parametrize("shape", [(8, 5), (5,), (2, 3, 7), ()])
def test_linear_wrong_input_shape_names_both_shapes(shape):
    layer = Linear(4, 3)
    with pytest.raises(ValueError) as err:
        layer(Tensor(np.ones(shape)))
    msg = str(err.value)
    assert str(tuple(shape)) in msg and "(3, 4)" in msg, \
        f"Linear(4, 3) on input {shape}: the error must name the input shape {shape} and the weight shape (3, 4); got: {msg}"


# ---------------------------------------------------------------------------------------------
# Exercise 3.7: Dropout
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("3.7", "Dropout.forward")
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics(p):
    x = Tensor(np.full((400, 500), 2.0, dtype=np.float32))
    y = Dropout(p, seed=0)(x)
    assert y.shape == x.shape and y.dtype == np.float32, f"Dropout changed shape/dtype: {y.shape} {y.dtype}"
    dropped = float((y.data == 0).mean())
    assert abs(dropped - p) < 0.01, f"Dropout(p={p}) zeroed {dropped:.4f} of the elements; expected {p} +- 0.01"
    kept = y.data[y.data != 0]
    np.testing.assert_allclose(kept, 2.0 / (1 - p), rtol=1e-6,
                               err_msg=f"Dropout(p={p}): survivors must be scaled by 1/(1-p) = {1 / (1 - p):.4f}")
    assert abs(y.data.mean() / 2.0 - 1) < 0.03, f"inverted dropout keeps the mean: got {y.data.mean():.4f}, expected 2.0"


@pytest.mark.exercise("3.7", "Dropout.forward")
def test_dropout_is_identity_in_eval_and_for_p_zero():
    x = Tensor(np.random.default_rng(0).standard_normal((30, 40)))
    d = Dropout(0.5, seed=0).eval()
    assert d.training is False
    np.testing.assert_array_equal(d(x).data, x.data, err_msg="Dropout in eval mode must return its input unchanged")
    np.testing.assert_array_equal(Dropout(0.0, seed=0)(x).data, x.data, err_msg="Dropout(p=0) is the identity")
    d.train()
    assert (d(x).data == 0).any(), "after train() Dropout must drop again"


@pytest.mark.exercise("3.7", "Dropout.forward")
def test_dropout_seed_reproducibility():
    x = Tensor(np.ones((50, 60), dtype=np.float32))
    a, b = Dropout(0.3, seed=42), Dropout(0.3, seed=42)
    first, second = a(x).data, a(x).data
    np.testing.assert_array_equal(first, b(x).data, err_msg="two Dropout(0.3, seed=42) must draw the same first mask")
    np.testing.assert_array_equal(second, b(x).data, err_msg="... and the same second mask")
    assert not np.array_equal(first, second), "each call must draw a new mask"
    assert not np.array_equal(first, Dropout(0.3, seed=43)(x).data), "different seeds must give different masks"


@pytest.mark.exercise("3.7", "Dropout.__init__")
@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_rejects_invalid_p(p):
    with pytest.raises(ValueError) as err:
        Dropout(p)
    assert str(p) in str(err.value), f"Dropout(p={p}): the error should name the bad value; got: {err.value}"


@pytest.mark.exercise("3.7", "Dropout.__init__")
def test_dropout_defaults_and_no_parameters():
    d = Dropout()
    assert d.p == 0.5, f"the default p is 0.5; got {d.p}"
    assert d.parameters() == [], "Dropout has no parameters"


# ---------------------------------------------------------------------------------------------
# Exercise 3.8: Sequential
# ---------------------------------------------------------------------------------------------
def relu_np(t: Tensor) -> Tensor:
    "A plain-function ReLU, so that these tests do not depend on module 02."
    return Tensor(np.maximum(t.data, 0))


@pytest.mark.exercise("3.8", "Sequential.forward")
@PROPERTY
@given(st.lists(st.integers(1, 12), min_size=2, max_size=5), st.integers(1, 6), st.integers(0, 1000))
def test_sequential_mlp_matches_numpy(widths, batch, seed):
    layers = []
    for k, (fin, fout) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Linear(fin, fout, rng=seed + k))
        if k < len(widths) - 2:
            layers.append(relu_np)
    net = Sequential(*layers)
    x = np.random.default_rng(seed).standard_normal((batch, widths[0])).astype(np.float32)
    ref = x.astype(np.float64)
    for layer in layers:
        ref = ref @ layer.weight.data.T + layer.bias.data if isinstance(layer, Linear) else np.maximum(ref, 0)
    y = net(Tensor(x))
    assert y.shape == (batch, widths[-1]), f"Sequential on widths {widths}: output shape {y.shape}; expected {(batch, widths[-1])}"
    np.testing.assert_allclose(y.data, ref, rtol=RTOL, atol=1e-4, err_msg=f"Sequential with widths {widths} differs from NumPy")


@pytest.mark.exercise("3.8", "Sequential.forward")
def test_sequential_order_and_plain_callables():
    net = Sequential(lambda t: t * 2, lambda t: t + 1)
    assert np.allclose(net(Tensor([1.0, 5.0])).data, [3.0, 11.0]), "layers must run in the order given: (x * 2) + 1"
    x = Tensor([1.0])
    assert Sequential()(x) is x, "an empty Sequential is the identity"


@pytest.mark.exercise("3.8", "Sequential.__init__")
def test_sequential_parameters_names_modes_and_indexing():
    inner = Sequential(Linear(3, 3, rng=1), relu_np)
    net = Sequential(Linear(2, 3, rng=0), relu_np, Dropout(0.2, seed=0), inner, Linear(3, 1, rng=2))
    expected = ["layers.0.weight", "layers.0.bias", "layers.3.layers.0.weight", "layers.3.layers.0.bias",
                "layers.4.weight", "layers.4.bias"]
    assert names(net) == expected, f"named_parameters() gave {names(net)}; expected {expected}"
    assert net.num_parameters() == (2 * 3 + 3) + (3 * 3 + 3) + (3 + 1)
    net.eval()
    assert not net[2].training and not inner.training and not inner[0].training, "eval() must reach nested layers"
    assert len(net) == 5 and net[1] is relu_np and list(net)[3] is inner, "len(), indexing and iteration give the layers"
    assert isinstance(net[:2], Sequential) and len(net[:2]) == 2, "slicing gives a Sequential"


@pytest.mark.exercise("3.8", "Sequential.__init__")
def test_sequential_rejects_non_callables():
    with pytest.raises(TypeError) as err:
        Sequential(Linear(2, 2), 3)
    assert "1" in str(err.value) and "int" in str(err.value), \
        f"Sequential(Linear(2, 2), 3): the error should name position 1 and type int; got: {err.value}"


# ---------------------------------------------------------------------------------------------
# state_dict / load_state_dict (given code in the Module cell; module 08 saves it to disk)
# ---------------------------------------------------------------------------------------------
def test_state_dict_holds_copies_under_dotted_names():
    tree = Tree()
    state = tree.state_dict()
    expected = [name for name, _ in tree.named_parameters()] + [name for name, _ in tree.named_buffers()]
    assert list(state) == expected, list(state)
    for name, p in [*tree.named_parameters(), *tree.named_buffers()]:
        assert isinstance(state[name], np.ndarray) and state[name].shape == p.shape, name
        assert not np.shares_memory(state[name], p.data), f"state_dict()[{name!r}] must be a copy, not a view"
    tree.first.w.data += 5
    assert np.all(state["first.w"] == 1), "changing a parameter after state_dict() changed the saved copy"


def test_load_state_dict_round_trip_in_place():
    src, dst = Tree(), Tree()
    for i, p in enumerate(src.parameters()):
        p.data[...] = np.arange(p.size, dtype=np.float32).reshape(p.shape) + i
    arrays = [p.data for p in dst.parameters()]
    result = dst.load_state_dict(src.state_dict())
    assert result == ([], [])
    for (name, a), b, arr in zip(src.named_parameters(), dst.parameters(), arrays):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)
        assert b.data is arr, f"{name}: load_state_dict must copy into the existing array (optimizers hold it)"
    # Tensors and float64 arrays are accepted and cast to the parameter dtype
    dst.load_state_dict({k: Tensor(v.astype(np.float64)) for k, v in src.state_dict().items()})
    assert all(p.data.dtype == np.float32 for p in dst.parameters())


def test_load_state_dict_strict_names_missing_and_unexpected_keys_and_changes_nothing():
    tree = Tree()
    before = {k: v.copy() for k, v in tree.state_dict().items()}
    state = {k: v + 1 for k, v in before.items()}
    del state["b"]
    state["extra.w"] = np.ones(3, dtype=np.float32)
    with pytest.raises(KeyError) as e:
        tree.load_state_dict(state)
    assert "missing ['b']" in str(e.value) and "unexpected ['extra.w']" in str(e.value), str(e.value)
    for k, v in tree.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"a refused load changed {k}")
    missing, unexpected = tree.load_state_dict(state, strict=False)
    assert (missing, unexpected) == (["b"], ["extra.w"])
    np.testing.assert_array_equal(tree.first.w.data, before["first.w"] + 1)


def test_load_state_dict_shape_mismatch_names_key_and_both_shapes():
    tree = Tree()
    state = tree.state_dict()
    state["blocks.2.w"] = np.zeros((3, 4), dtype=np.float32)
    for strict in (True, False):
        with pytest.raises(ValueError) as e:
            tree.load_state_dict(state, strict=strict)
        assert "'blocks.2.w'" in str(e.value) and "(3, 4)" in str(e.value) and "(4, 4)" in str(e.value), str(e.value)
    with pytest.raises(TypeError, match="expects a dict"):
        tree.load_state_dict([1, 2])


def test_state_dict_matches_torch_names_for_linear():
    torch = pytest.importorskip("torch")
    ours = Sequential(Linear(3, 4, rng=0), Linear(4, 2, rng=1))
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    theirs = {k.replace("0.", "layers.0.", 1).replace("1.", "layers.1.", 1): v.detach().numpy()
              for k, v in ref.state_dict().items()}
    assert set(theirs) == set(ours.state_dict())
    ours.load_state_dict(theirs)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(ours(Tensor(x)).data, ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_state_dict_holds_buffers_too():
    """Non-parameter leaf tensors (running statistics) are buffers: saved and restored, never trained."""

    class WithStats(Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(2, 2, rng=0)
            self.running = Tensor(np.zeros(2, dtype=np.float32))

    a, b = WithStats(), WithStats()
    a.running.data[:] = [3.0, 4.0]
    assert [n for n, _ in a.named_buffers()] == ["running"], list(a.named_buffers())
    assert [n for n, _ in a.named_parameters()] == ["fc.weight", "fc.bias"], "a buffer is not a parameter"
    state = a.state_dict()
    assert list(state) == ["fc.weight", "fc.bias", "running"], list(state)
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.running.data, [3.0, 4.0], err_msg="load_state_dict must restore buffers")
    with pytest.raises(KeyError, match="running"):
        b.load_state_dict({k: v for k, v in state.items() if k != "running"})


# ----- forward hooks and named_modules (given code: the seams a profiler uses) -----

def test_forward_hooks_run_around_forward_can_replace_and_are_removable():
    from tinytorch.core.layers import Sequential
    net = Sequential(Linear(3, 4, rng=0), Linear(4, 2, rng=1))
    calls = []
    pre = net.layers[0].register_forward_pre_hook(lambda m, args: calls.append(("pre", m, args[0].shape)))
    post = net.layers[0].register_forward_hook(lambda m, args, out: calls.append(("post", m, out.shape)))
    x = Tensor(np.ones((5, 3), np.float32))
    net(x)
    assert calls == [("pre", net.layers[0], (5, 3)), ("post", net.layers[0], (5, 4))], (
        f"hooks saw {calls}; expected pre-hook(module, args) then hook(module, args, output) around layers[0]")
    pre.remove()
    post.remove()
    post.remove()  # twice is harmless
    net(x)
    assert len(calls) == 2, f"removed hooks must not run; {len(calls) - 2} extra call(s)"
    doubled = net.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
    expected = net.forward(x * 2.0).data
    got = net(x).data
    np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg="a pre-hook's returned tuple replaces the arguments")
    doubled.remove()
    net.register_forward_hook(lambda m, args, out: out * 0.0)
    assert np.all(net(x).data == 0), f"a hook's returned value replaces the output; got {net(x).data}"
    other = Sequential(Linear(3, 4, rng=0))
    assert not other._forward_hooks, "hooks belong to one module, never shared through the class"
    with pytest.raises(TypeError, match="callable"):
        net.register_forward_hook(3)


def test_named_modules_gives_every_module_once_with_its_path():
    from tinytorch.core.layers import Module, Sequential

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.body = Sequential(Linear(2, 3, rng=0), Linear(3, 2, rng=1))
            self.head = Linear(2, 1, rng=2)
            self.tied = self.head

        def forward(self, x):
            return self.head(self.body(x))

    net = Net()
    got = [(name, type(m).__name__) for name, m in net.named_modules()]
    expected = [("", "Net"), ("body", "Sequential"), ("body.layers.0", "Linear"), ("body.layers.1", "Linear"),
                ("head", "Linear")]
    assert got == expected, f"named_modules() gave {got}; expected {expected} (each module once, first path wins)"
    assert [n for n, _ in net.named_modules(prefix="net")][:2] == ["net", "net.body"], "prefix names the top module"


def test_check_positive_int_names_the_caller_the_argument_and_the_value():
    from tinytorch.core.layers import check_positive_int
    assert check_positive_int(np.int64(3), "n", "F") == 3 and type(check_positive_int(np.int64(3), "n", "F")) is int
    for bad in (0, -2, 2.0, True, "3", None):
        with pytest.raises(ValueError) as info:
            check_positive_int(bad, "in_features", "Linear")
        assert str(info.value) == f"Linear: in_features must be a positive integer; got {bad!r}", (
            f"check_positive_int({bad!r}, 'in_features', 'Linear') raised {str(info.value)!r}")

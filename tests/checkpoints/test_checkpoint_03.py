"""Checkpoint 03: can your Tensor, activations and layers make a working classifier at initialization?

An MLP `Sequential(Linear, ReLU, Dropout, Linear, Softmax)` is built from modules 01-03 and run on a
random batch: output shape, valid probabilities, the parameter count and names, train/eval
behaviour of the Dropout inside, reproducibility from seeds, and the whole forward pass recomputed
in NumPy (float64).
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.activations import ReLU, Softmax, Tanh
from tinytorch.core.layers import Dropout, Linear, Module, Sequential
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("03")

N, D, H, C = 32, 20, 64, 5


def make_mlp(seed: int = 0, p: float = 0.0) -> Sequential:
    return Sequential(Linear(D, H, rng=seed), ReLU(), Dropout(p, seed=seed), Linear(H, C, init="xavier", rng=seed + 1),
                      Softmax(dim=-1))


def numpy_reference(mlp: Sequential, x: np.ndarray) -> np.ndarray:
    fc1, fc2 = mlp[0], mlp[3]
    h = np.maximum(x.astype(np.float64) @ fc1.weight.data.T + fc1.bias.data, 0)
    logits = h @ fc2.weight.data.T + fc2.bias.data
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def batch() -> Tensor:
    return Tensor(np.random.default_rng(123).standard_normal((N, D)))


def test_mlp_outputs_valid_probabilities(batch):
    mlp = make_mlp().eval()
    probs = mlp(batch)
    assert isinstance(probs, Tensor), f"the MLP returned {type(probs).__name__}; expected a Tensor"
    assert probs.shape == (N, C), f"MLP output shape {probs.shape}; expected (batch, classes) = {(N, C)}"
    assert probs.dtype == np.float32, f"MLP output dtype {probs.dtype}; expected float32"
    p = probs.data
    assert np.all(np.isfinite(p)) and np.all(p >= 0) and np.all(p <= 1), "probabilities must be finite and in [0, 1]"
    np.testing.assert_allclose(p.sum(axis=-1), np.ones(N), atol=1e-5, err_msg="each row of probabilities must sum to 1")
    np.testing.assert_allclose(p, numpy_reference(mlp, batch.data), rtol=1e-4, atol=1e-6,
                               err_msg="MLP forward pass differs from the NumPy reference")
    assert (p.argmax(axis=-1) >= 0).all() and p.argmax(axis=-1).shape == (N,)


def test_parameter_count_and_names():
    mlp = make_mlp()
    expected_count = D * H + H + H * C + C
    params = mlp.parameters()
    assert sum(p.size for p in params) == expected_count == mlp.num_parameters(), \
        f"parameter count {sum(p.size for p in params)}; expected {D}*{H} + {H} + {H}*{C} + {C} = {expected_count}"
    names = [n for n, _ in mlp.named_parameters()]
    assert names == ["layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias"], f"names: {names}"
    assert all(p.requires_grad and p.dtype == np.float32 for p in params), "parameters: float32, requires_grad=True"
    assert sum(p.nbytes for p in params) == 4 * expected_count, "float32 parameters take 4 bytes each"


def test_dropout_inside_follows_train_and_eval(batch):
    mlp = make_mlp(p=0.5)
    hidden = Sequential(*mlp.layers[:3])            # Linear, ReLU, Dropout: shares the layers
    mlp.train()
    dropped = hidden(batch).data
    assert mlp.training and hidden[2].training, "train() must put the Dropout inside the MLP in training mode"
    relu_out = np.maximum(batch.data @ mlp[0].weight.data.T + mlp[0].bias.data, 0)
    assert ((dropped == 0) & (relu_out > 0)).any(), "in training mode the Dropout must zero some active units"
    mlp.eval()
    assert not hidden[2].training, "eval() on the MLP must reach its Dropout"
    np.testing.assert_allclose(hidden(batch).data, relu_out, rtol=1e-5, atol=1e-6,
                               err_msg="in eval mode Dropout must be the identity")
    a, b = mlp(batch).data, mlp(batch).data
    np.testing.assert_array_equal(a, b, err_msg="in eval mode the MLP must be deterministic")


def test_seeds_make_models_reproducible(batch):
    m1, m2, m3 = make_mlp(seed=7).eval(), make_mlp(seed=7).eval(), make_mlp(seed=8).eval()
    np.testing.assert_array_equal(m1(batch).data, m2(batch).data, err_msg="the same seeds must give the same model")
    assert not np.allclose(m1(batch).data, m3(batch).data), "different seeds must give different models"


def test_custom_module_composes_layers_and_activations(batch):
    class Net(Module):
        def __init__(self):
            super().__init__()
            self.body = [Linear(D, H, rng=0), Linear(H, H, rng=1)]
            self.act = Tanh()
            self.head = Linear(H, C, rng=2)

        def forward(self, x):
            for layer in self.body:
                x = self.act(layer(x))
            return self.head(x)

    net = Net()
    out = net(batch)
    assert out.shape == (N, C), f"custom Module output shape {out.shape}; expected {(N, C)}"
    names = [n for n, _ in net.named_parameters()]
    assert names == ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias", "head.weight", "head.bias"], names
    assert net.num_parameters() == D * H + H + H * H + H + H * C + C

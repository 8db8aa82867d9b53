"""Small models the tests and benchmarks of several modules build the same way."""
from __future__ import annotations

from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Linear, Sequential


def mlp(widths, seed=0):
    """`Linear(widths[0], widths[1]), ReLU(), ..., Linear(widths[-2], widths[-1])`, layer i seeded `seed + i`."""
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(Linear(a, b, rng=seed + i))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Sequential(*layers)

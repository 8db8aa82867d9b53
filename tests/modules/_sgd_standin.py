"""Stand-in for module 07's `tinytorch.core.optimizers.SGD`, used by module 08's tests so that they
check the training code alone (a module 08 failure never comes from module 07).

It has the interface module 08 relies on: `lr` (read and set by the schedulers), `zero_grad()`,
`step()`, `state_dict()` and `load_state_dict()`, and PyTorch's SGD update with momentum
(`v = momentum * v + g`, `p -= lr * v`).
"""
import numpy as np


class SGD:
    "Minimal momentum SGD with module 07's interface (stand-in for `tinytorch.core.optimizers.SGD`)."

    def __init__(self, params, lr, momentum=0.0):
        self.params, self.lr, self.momentum = list(params), float(lr), float(momentum)
        self.velocity = [None] * len(self.params)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.data
            if self.momentum:
                if self.velocity[i] is None:
                    self.velocity[i] = g.copy()
                else:
                    self.velocity[i] *= self.momentum
                    self.velocity[i] += g
                g = self.velocity[i]
            p.data -= self.lr * g

    def state_dict(self):
        return {"lr": self.lr, "momentum": self.momentum,
                "velocity": {i: v.copy() for i, v in enumerate(self.velocity) if v is not None}}

    def load_state_dict(self, state):
        for i, v in state["velocity"].items():
            if v.shape != self.params[i].shape:
                raise ValueError(f"SGD.load_state_dict: velocity {i} has shape {v.shape}, parameter {self.params[i].shape}")
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.velocity = [None] * len(self.params)
        for i, v in state["velocity"].items():
            self.velocity[i] = v.copy()

"""Modes, observers and backends are per thread, as in PyTorch (grad mode and autocast are thread-local there).

Two threads step through a fixed interleaving (each step waits for the other's with events, so the
order is the same on a loaded machine): A enters `no_grad`, B enters, A exits, B exits. Each thread
must see its own mode at every step, and the process must end with grad mode on. The same for op
observers, conversion observers, backward observers and the compute backend.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tinytorch.core import tensor as T
from tinytorch.core.autograd import no_grad, observe_backward
from tinytorch.core.tensor import Tensor, is_grad_enabled


class Steps:
    "Run two thread bodies in a fixed interleaving: `step(who, i)` waits until it is step i's turn."

    def __init__(self, order):
        self.order, self.events = order, [threading.Event() for _ in range(len(order) + 1)]
        self.events[0].set()
        self.errors = []

    def turn(self, i):
        assert self.events[i].wait(10), f"step {i} never came"

    def done(self, i):
        self.events[i + 1].set()

    def run(self, a, b):
        threads = [threading.Thread(target=self._guard, args=(f,)) for f in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if self.errors:
            raise self.errors[0]

    def _guard(self, f):
        try:
            f()
        except BaseException as e:  # noqa: BLE001 - reported by run()
            self.errors.append(e)
            for ev in self.events:   # let the other thread finish
                ev.set()


def test_grad_mode_is_per_thread_under_interleaved_no_grad():
    s = Steps(["A enters", "B enters", "A exits", "B exits"])
    seen = {}

    def a():
        s.turn(0)
        ctx = no_grad()
        ctx.__enter__()
        seen["A inside"] = is_grad_enabled()
        s.done(0)
        s.turn(2)
        seen["A sees B's block"] = is_grad_enabled()
        ctx.__exit__(None, None, None)
        seen["A after"] = is_grad_enabled()
        x = Tensor(np.ones(3, np.float32), requires_grad=True)
        seen["A records"] = (x * 2).grad_fn is not None
        s.done(2)

    def b():
        s.turn(1)
        seen["B before"] = is_grad_enabled()
        ctx = no_grad()
        ctx.__enter__()
        s.done(1)
        s.turn(3)
        seen["B inside after A left"] = is_grad_enabled()
        x = Tensor(np.ones(3, np.float32), requires_grad=True)
        seen["B records inside"] = (x * 2).grad_fn is not None
        ctx.__exit__(None, None, None)
        seen["B after"] = is_grad_enabled()
        s.done(3)

    s.run(a, b)
    assert seen == {"A inside": False, "B before": True, "A sees B's block": False, "A after": True,
                    "A records": True, "B inside after A left": False, "B records inside": False, "B after": True}, seen
    assert is_grad_enabled(), "the main thread's grad mode must not change"
    assert T._DEPARTURES == 0, "every thread is back at the defaults: ops must take the fast path again"


def test_a_thread_that_ends_inside_no_grad_leaves_the_fast_path_on():
    import gc

    def body():
        no_grad().__enter__()   # never exited
        Tensor(np.ones(2, np.float32)) * 2.0

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    del t
    gc.collect()
    assert T._DEPARTURES == 0 and is_grad_enabled()


def test_op_observers_see_their_own_thread_only():
    s = Steps(["A observes", "B computes", "A computes"])
    ops = {"A": [], "B": []}

    def a():
        s.turn(0)
        with T.observe_ops(lambda node, out: ops["A"].append(node.op)):
            s.done(0)
            s.turn(2)
            Tensor(np.ones(2, np.float32)).exp()
        s.done(2)

    def b():
        s.turn(1)
        Tensor(np.ones(2, np.float32)) * 3.0   # must not reach A's observer
        ops["B"].append(len(T.active_op_observers()))
        s.done(1)

    s.run(a, b)
    assert ops == {"A": ["exp"], "B": [0]}, ops
    assert T.active_op_observers() == ()


def test_a_handle_removed_from_another_thread_removes_the_observer():
    calls = []
    handle = T.add_op_observer(lambda node, out: calls.append(node.op))
    t = threading.Thread(target=handle.remove)
    t.start()
    t.join(10)
    Tensor(np.ones(2, np.float32)).exp()
    assert calls == [] and T.active_op_observers() == ()


def test_conversion_observers_are_per_thread_and_see_bool_float_int_item():
    got, other = [], []
    x = Tensor(np.array([2.5], np.float32))
    with T.observe_conversions(lambda t, how, value: got.append((how, value))):
        t = threading.Thread(target=lambda: other.append((bool(x), float(x), int(x), x.item())))
        t.start()
        t.join(10)
        values = (bool(x), float(x), int(x), x.item())
    assert values == (True, 2.5, 2, 2.5) and other == [values]
    assert got == [("bool", True), ("float", 2.5), ("int", 2), ("item", 2.5)], got
    with pytest.raises(ValueError, match=r"float\(\): only a tensor with one element.*shape \(2,\)"):
        float(Tensor(np.ones(2, np.float32)))


def test_backward_observers_are_per_thread():
    s = Steps(["A observes", "B backward", "A backward"])
    heard = {"A": [], "B": []}

    def loss():
        x = Tensor(np.ones(3, np.float32), requires_grad=True)
        ((x * 2.0).exp()).sum().backward()
        return x

    def a():
        s.turn(0)
        with observe_backward(lambda node, grad, grads, t0, t1: heard["A"].append((node.op, t1 >= t0))):
            s.done(0)
            s.turn(2)
            loss()
        s.done(2)

    def b():
        s.turn(1)
        x = loss()
        heard["B"].append(float(x.grad.data.sum()) > 0)
        s.done(1)

    s.run(a, b)
    assert heard["B"] == [True]
    assert sorted(op for op, _ in heard["A"]) == ["exp", "mul", "sum"] and all(ok for _, ok in heard["A"]), heard


def test_compute_backend_is_per_thread():
    class Recording:
        def __init__(self):
            self.calls = []

        def matmul(self, a, b):
            self.calls.append("matmul")
            return np.matmul(a, b)

        def binary(self, op, ufunc, a, b):
            self.calls.append(op)
            return ufunc(a, b)

        def unary(self, op, ufunc, a):
            self.calls.append(op)
            return ufunc(a)

    s = Steps(["A sets", "B computes", "A computes and resets"])
    backend = Recording()
    seen = {}

    def a():
        s.turn(0)
        previous = T.set_compute_backend(backend)
        s.done(0)
        s.turn(2)
        m = Tensor(np.ones((2, 2), np.float32))
        _ = m @ m + m
        T.set_compute_backend(previous)
        seen["A after"] = T.get_compute_backend()
        s.done(2)

    def b():
        s.turn(1)
        seen["B backend"] = T.get_compute_backend()
        m = Tensor(np.ones((2, 2), np.float32))
        _ = m @ m
        s.done(1)

    s.run(a, b)
    assert seen == {"B backend": None, "A after": None} and backend.calls == ["matmul", "add"], (seen, backend.calls)

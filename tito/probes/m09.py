"""Probes of module 09 (convolutions): see tito/probes/__init__.py. Gradients come from the reference
traversal of module 06 (`loss.backward()` over a random upstream gradient). Replayed (one bug charged once):
9.3 the reference's recorded outcomes of `im2col`/`conv2d_forward`; 9.4 also of `col2im` and
`Conv2dFunction.backward` (it checks the layer)."""
import numpy as np

from . import probe

CONV = ("im2col", "conv2d_forward")


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def grads(rng, out, *inputs):
    """Backward of `sum(out * g)` for a random g: the inputs' gradients (or what was raised)."""
    from tinytorch.core.tensor import Tensor

    g = Tensor(f32(rng, *out.shape))
    (out * g).sum().backward()
    return [None if t.grad is None else t.grad.data for t in inputs]


CONFIGS = (("k3", (2, 3, 7, 6), (4, 3, 3, 3), 1, 0), ("s2p1", (2, 2, 8, 7), (3, 2, 3, 2), 2, 1),
           ("rect", (1, 3, 6, 9), (2, 3, 2, 4), (1, 2), (2, 0)), ("1x1", (2, 4, 5, 5), (6, 4, 1, 1), 1, 0))


@probe("9.1")
def conv_loop(rng, rec):
    from tinytorch.core.spatial import conv2d_loop

    for key, xs, ws, s, p in CONFIGS[:3]:
        rec.call(key, conv2d_loop, f32(rng, *xs), f32(rng, *ws), f32(rng, ws[0]), s, p)
    rec.call("nobias", conv2d_loop, f32(rng, 1, 2, 5, 5), f32(rng, 3, 2, 3, 3))
    rec.call("bad", conv2d_loop, f32(rng, 1, 2, 5, 5), f32(rng, 3, 4, 3, 3))


@probe("9.2")
def im2col(rng, rec):
    from tinytorch.core.spatial import conv2d_forward, im2col as i2c

    for key, xs, ws, s, p in CONFIGS:
        x, w, b = f32(rng, *xs), f32(rng, *ws), f32(rng, ws[0])
        rec.call(key + "_cols", i2c, x, ws[2:], s, p)
        rec.call(key + "_out", lambda: conv2d_forward(x, w, b, s, p)[0])
        rec.call(key + "_contiguous", lambda: bool(conv2d_forward(x, w, b, s, p)[0].flags.c_contiguous))
    rec.call("bad", conv2d_forward, f32(rng, 1, 2, 5, 5), f32(rng, 3, 4, 3, 3))
    products = []   # the contract: one product, through the `matmul` argument (module 17's backends plug in there)

    def counting_matmul(a, b):
        products.append([list(a.shape), list(b.shape)])
        return np.matmul(a, b)
    x, w = f32(rng, 2, 3, 6, 5), f32(rng, 4, 3, 3, 3)
    rec.call("through_matmul", lambda: conv2d_forward(x, w, None, 1, 1, matmul=counting_matmul)[0])
    rec["products"] = products


@probe("9.3", replay=CONV)
def conv_backward(rng, rec):
    from tinytorch.core.spatial import Conv2dFunction, col2im, im2col as i2c
    from tinytorch.core.tensor import Tensor

    for key, xs, ws, s, p in CONFIGS:
        cols, _ = i2c(f32(rng, *xs), ws[2:], s, p)
        rec.call(key + "_col2im", col2im, f32(rng, *cols.shape), xs, ws[2:], s, p)
        x, w, b = (Tensor(f32(rng, *sh), requires_grad=True) for sh in (xs, ws, (ws[0],)))
        rec.call(key + "_grads", lambda: grads(rng, Conv2dFunction.apply(x, w, b, stride=s, padding=p), x, w, b))
    x = Tensor(f32(rng, 2, 3, 6, 6))  # a first layer's input: no gradient wanted
    w = Tensor(f32(rng, 4, 3, 3, 3), requires_grad=True)
    rec.call("first_layer", lambda: grads(rng, Conv2dFunction.apply(x, w, None, padding=1), x, w))


@probe("9.4", replay=CONV + ("col2im", "Conv2dFunction.backward"))
def conv_layer(rng, rec):
    from tinytorch.core.spatial import Conv2d
    from tinytorch.core.tensor import Tensor

    seed = int(rng.integers(0, 2 ** 30))
    layer = rec.call("layer", Conv2d, 3, 4, 3, stride=(2, 1), padding=1, rng=seed)
    if layer is not None:
        rec["attrs"] = [layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.padding]
        rec["params"] = [layer.weight, layer.bias, bool(layer.weight.requires_grad)]
        x = Tensor(f32(rng, 2, 3, 7, 6), requires_grad=True)
        rec.call("forward", layer, x)
        rec.call("grads", lambda: grads(rng, layer(x), x, layer.weight, layer.bias))
        rec.call("array_in", layer, f32(rng, 1, 3, 5, 5))
        rec.call("bad_shape", layer, Tensor(f32(rng, 1, 2, 5, 5)))
    nb = rec.call("nobias", Conv2d, 2, 3, (2, 3), bias=False, rng=seed)
    if nb is not None:
        rec["nobias_params"] = [nb.weight, nb.bias]
        rec.call("nobias_out", nb, Tensor(f32(rng, 1, 2, 5, 5)))
    rec.call("bad_channels", Conv2d, 0, 3, 3)
    rec.call("bad_kernel", Conv2d, 2, 3, 0)


def _pool(rng, rec, cls):
    import tinytorch.core.spatial as S
    from tinytorch.core.tensor import Tensor

    for key, shape, k, s in (("k2", (2, 3, 6, 6), 2, None), ("overlap", (1, 2, 7, 7), 3, 2), ("rect", (2, 1, 6, 9), (2, 3), (2, 3))):
        x = Tensor(f32(rng, *shape), requires_grad=True)
        pool = getattr(S, cls)(k, s)
        rec.call(key, pool, x)
        rec.call(key + "_grad", lambda: grads(rng, pool(x), x))
    ties = np.zeros((1, 1, 4, 4), dtype=np.float32)
    ties[0, 0, 1, 1] = np.nan
    ties[0, 0, 2:, 2:] = 5.0
    t = Tensor(ties, requires_grad=True)
    pool = getattr(S, cls)(2)
    rec.call("ties_nan", pool, t)
    rec.call("ties_nan_grad", lambda: grads(rng, pool(t), t))


@probe("9.5")
def maxpool(rng, rec):
    _pool(rng, rec, "MaxPool2d")


@probe("9.6")
def avgpool(rng, rec):
    _pool(rng, rec, "AvgPool2d")


@probe("9.7")
def batchnorm(rng, rec):
    from tinytorch.core.spatial import BatchNorm2d
    from tinytorch.core.tensor import Tensor

    bn = BatchNorm2d(3, momentum=0.2)
    bn.weight.data[:] = rng.uniform(0.5, 2, 3)
    bn.bias.data[:] = rng.standard_normal(3)
    for i in range(2):
        x = Tensor((f32(rng, 4, 3, 3, 2) * 2 + 1).astype(np.float32), requires_grad=True)
        rec.call(f"train{i}", bn, x)
        rec.call(f"train{i}_grads", lambda: grads(rng, bn(x), x, bn.weight, bn.bias))
    rec["running"] = [bn.running_mean, bn.running_var]
    bn.eval()
    x = Tensor(f32(rng, 2, 3, 3, 3), requires_grad=True)
    rec.call("eval", bn, x)
    rec.call("eval_grads", lambda: grads(rng, bn(x), x, bn.weight, bn.bias))
    rec["running_after_eval"] = [bn.running_mean, bn.running_var]
    bn.train()
    rec.call("one_value", bn, Tensor(f32(rng, 1, 3, 1, 1)))
    rec.call("bad_shape", bn, Tensor(f32(rng, 2, 4, 3, 3)))


@probe("9.8")
def flatten(rng, rec):
    from tinytorch.core.spatial import Flatten
    from tinytorch.core.tensor import Tensor

    x = Tensor(f32(rng, 2, 3, 4, 5), requires_grad=True)
    for key, start in (("d1", 1), ("d2", 2), ("d0", 0), ("neg", -2)):
        rec.call(key, lambda start=start: Flatten(start)(x))
    rec.call("grad", lambda: grads(rng, Flatten()(x), x))
    rec.call("array", lambda: Flatten()(f32(rng, 3, 2, 2)))

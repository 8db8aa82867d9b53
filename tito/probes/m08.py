"""Probes of module 08 (training): see tito/probes/__init__.py. 8.4 replays the reference's recorded outcomes of
`clip_grad_norm_`; 8.6 loads the files the reference's `save_checkpoint` wrote (replayed as data), so each bug is
charged once. Models, losses and optimizers come from modules 03-07 (the reference, prerequisites of 08)."""
import os

import numpy as np

from . import probe


def _model(seed):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential

    return Sequential(Linear(4, 6, rng=seed), ReLU(), Linear(6, 3, rng=seed + 1))


def _data(rng, n=10):
    from tinytorch.core.tensor import Tensor

    return Tensor(rng.standard_normal((n, 4)).astype(np.float32)), Tensor(rng.integers(0, 3, size=n))


def _params(model):
    return [p.data.copy() for p in model.parameters()]


@probe("8.1")
def schedulers(rng, rec):
    from tinytorch.core.optimizers import SGD
    from tinytorch.core.tensor import Tensor
    from tinytorch.core.training import CosineAnnealingLR, LinearWarmup, StepLR

    def opt():
        return SGD([Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)], lr=float(rng.uniform(0.05, 0.5)))
    ts = list(range(0, 25))
    for key, make in (("step", lambda: StepLR(opt(), step_size=int(rng.integers(2, 5)), gamma=0.5)),
                      ("step1", lambda: StepLR(opt(), step_size=1, gamma=0.9)),
                      ("cos", lambda: CosineAnnealingLR(opt(), T_max=int(rng.integers(5, 12)), eta_min=0.01)),
                      ("cos0", lambda: CosineAnnealingLR(opt(), T_max=10)),
                      ("warm", lambda: LinearWarmup(opt(), warmup_steps=int(rng.integers(2, 7)), start_factor=0.2)),
                      ("warm1", lambda: LinearWarmup(opt(), warmup_steps=3, start_factor=1.0))):
        s = make()
        rec.call(key, lambda s=s: [float(s.lr_at(t)) for t in ts])
        rec.call(key + "_steps", lambda s=s: [float(s.step()) for _ in range(6)] + [float(s.optimizer.lr)])


@probe("8.2")
def clip(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.core.training import clip_grad_norm_

    def params(scale):
        ps = [Tensor(np.zeros(s, dtype=np.float32), requires_grad=True) for s in ((3, 2), (5,), (2,))]
        for p in ps[:2]:
            p.grad = Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32))
        return ps
    for key, scale, max_norm in (("clip", 3.0, 1.0), ("keep", 0.01, 5.0), ("edge", 1.0, 0.5)):
        ps = params(scale)
        arrays = [p.grad.data for p in ps[:2]]
        rec.call(key, clip_grad_norm_, ps, max_norm)
        rec[key + "_grads"] = [p.grad for p in ps[:2]]
        rec[key + "_same_arrays"] = [p.grad.data is a for p, a in zip(ps, arrays)]
    zero = params(0.0)
    rec.call("zero", clip_grad_norm_, zero, 1.0)
    rec["zero_grads"] = [p.grad for p in zero[:2]]
    rec.call("generator", clip_grad_norm_, (p for p in params(2.0)), 1.0)
    rec.call("none", clip_grad_norm_, [Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)], 1.0)
    rec.call("bad", clip_grad_norm_, params(1.0), -1.0)


@probe("8.3")
def evaluate(rng, rec):
    from tinytorch.core.layers import Dropout, Sequential
    from tinytorch.core.losses import CrossEntropyLoss, MSELoss
    from tinytorch.core.training import evaluate as ev
    from tinytorch.data.loader import DataLoader, TensorDataset

    seed = int(rng.integers(0, 2 ** 30))
    model = Sequential(_model(seed), Dropout(0.5, seed=1))
    x, y = _data(rng, 11)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    rec.call("ce", ev, model, loader, CrossEntropyLoss())
    rec["mode_after"] = bool(model.training)
    rec.call("noloss", ev, model, loader)
    model.eval()
    rec.call("eval_mode", ev, model, loader, CrossEntropyLoss())
    rec["mode_kept"] = bool(model.training)
    model.train()
    reg = DataLoader(TensorDataset(x, rng.standard_normal((11, 3)).astype(np.float32)), batch_size=5)
    rec.call("mse", ev, model, reg, MSELoss())
    rec.call("empty", ev, model, [], CrossEntropyLoss())
    rec["grads"] = [p.grad is None for p in model.parameters()]

    def broken(t):
        raise RuntimeError("boom")
    rec.call("raises", ev, Sequential(model, broken), loader)
    rec["mode_after_error"] = bool(model.training)


@probe("8.4", replay=("clip_grad_norm_",))
def trainer(rng, rec):
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.optimizers import SGD, Adam
    from tinytorch.core.training import Trainer

    for key, kw, make in (("sgd", {}, lambda ps: SGD(ps, lr=0.1, momentum=0.9)),
                          ("clip", {"max_grad_norm": 0.5}, lambda ps: Adam(ps, lr=0.01))):
        model = _model(int(rng.integers(0, 2 ** 30)))
        t = Trainer(model, CrossEntropyLoss(), make(model.parameters()), progress=False, **kw)
        losses = []
        for _ in range(3):
            x, y = _data(rng, 8)
            losses.append(rec.call(f"{key}_loss", t.train_step, x, y))
        rec[f"{key}_losses"] = losses
        rec[f"{key}_params"] = _params(model)
        rec[f"{key}_out"] = t.last_output
        rec[f"{key}_norm"] = t.last_grad_norm


def _step(rng, model, opt):
    """One optimizer step with random gradients (no autograd, no Trainer: only the checkpoint is checked)."""
    from tinytorch.core.tensor import Tensor

    for p in model.parameters():
        p.grad = Tensor(rng.standard_normal(p.shape).astype(np.float32))
    opt.step()


def _saved(path):
    import json

    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = arrays.pop("__meta__", None)
    return {"meta": json.loads(meta.tobytes().decode()) if meta is not None else None, "arrays": arrays}


@probe("8.5", dtypes=True)
def save(rng, rec):
    import numpy
    from tinytorch.core.optimizers import Adam
    from tinytorch.core.training import save_checkpoint

    model = _model(int(rng.integers(0, 2 ** 30)))
    opt = Adam(model.parameters(), lr=0.01)
    _step(rng, model, opt)
    path = os.path.join("ckpt", "run", "model.npz")
    r = rec.call("returned", save_checkpoint, path, model, opt, 3, note="hi", history=[0.5, 0.25])
    rec["returned_type"] = type(r).__name__
    rec.call("file", _saved, path)
    rec.call("no_opt", lambda: (save_checkpoint("plain.npz", model, None, 0), _saved("plain.npz"))[1])
    before = open(path, "rb").read()
    real = numpy.savez

    def failing(file, *args, **kwargs):
        data = b"PK\x03\x04 half a checkpoint"
        if hasattr(file, "write"):
            file.write(data)
        else:
            with open(file, "wb") as f:
                f.write(data)
        raise OSError("disk full (simulated by the check)")
    numpy.savez = failing
    try:
        rec.call("crash", save_checkpoint, path, model, opt, 4)
    finally:
        numpy.savez = real
    after = open(path, "rb").read()
    rec["intact"] = np.frombuffer(after, dtype=np.uint8)
    rec["intact_ref"] = np.frombuffer(before, dtype=np.uint8)
    rec["left_over"] = sorted(os.listdir(os.path.dirname(path)))


@probe("8.6", replay=("save_checkpoint",))
def load(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.core.optimizers import SGD, Adam
    from tinytorch.core.training import load_checkpoint, save_checkpoint

    seed = int(rng.integers(0, 2 ** 30))
    model = _model(seed)
    opt = Adam(model.parameters(), lr=0.01)
    _step(rng, model, opt)
    save_checkpoint("a.npz", model, opt, 7, note="hi", curve=np.arange(3.0))
    fresh = _model(seed + 7)
    fresh_opt = Adam(fresh.parameters(), lr=0.5)
    rec.call("info", load_checkpoint, "a.npz", fresh, fresh_opt)
    rec["params"] = _params(fresh)
    rec.call("opt_state", fresh_opt.state_dict)
    other = _model(seed + 9)
    rec.call("model_only", load_checkpoint, "a.npz", other)
    rec["model_only_params"] = _params(other)
    wrong = _model(seed + 11)
    wrong_opt = SGD(wrong.parameters(), lr=0.1)
    rec.call("wrong_opt", load_checkpoint, "a.npz", wrong, wrong_opt)
    rec["wrong_opt_params"] = _params(wrong)  # a failed load changes nothing
    small = Linear(4, 3, rng=1)
    rec.call("wrong_model", load_checkpoint, "a.npz", small)
    with open("a.npz", "rb") as f:
        data = f.read()
    with open("cut.npz", "wb") as f:
        f.write(data[: len(data) // 2])
    rec.call("truncated", load_checkpoint, "cut.npz", _model(seed))
    rec.call("missing", load_checkpoint, "nope.npz", _model(seed))

"""Probes of module 07 (optimizers): see tito/probes/__init__.py. Gradients are set by hand (no autograd);
7.2-7.5 replay the reference's recorded outcomes of `Optimizer.__init__`, 7.2 of `SGD.step` and `Adam.step`, and
7.5 (AdamW) of `Adam.step`, so each bug is charged to its exercise."""
import numpy as np

from . import probe

INIT = ("Optimizer.__init__",)


def _params(rng, shapes=((3, 2), (4,))):
    from tinytorch.core.tensor import Tensor

    return [Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in shapes]


def _trajectory(rng, opt, params, steps=4, skip=None):
    from tinytorch.core.tensor import Tensor

    out = []
    for k in range(steps):
        for i, p in enumerate(params):
            p.grad = None if (skip is not None and i == skip and k == 1) else Tensor(
                rng.standard_normal(p.shape).astype(np.float32))
        opt.step()
        out.append([p.data.copy() for p in params])
    return out


@probe("7.1")
def base(rng, rec):
    from tinytorch.core.optimizers import Optimizer
    from tinytorch.core.tensor import Tensor

    ps = _params(rng)
    opt = rec.call("init", Optimizer, iter(ps), lr=0.1)
    if opt is not None:
        rec["params"] = [next((j for j, q in enumerate(ps) if q is p), -1) for p in opt.params]
        rec["list_type"] = type(opt.params).__name__
        for p in ps:
            p.grad = Tensor(np.ones(p.shape, dtype=np.float32))
        arrays = [p.grad.data for p in ps]
        rec.call("zero_keep", opt.zero_grad, False)
        rec["kept"] = [p.grad.data is a for p, a in zip(ps, arrays)]
        rec["zeros"] = [p.grad.data for p in ps]
        ps[0].grad = None
        rec.call("zero_keep_none", opt.zero_grad, set_to_none=False)
        rec["none_stays"] = ps[0].grad is None
        rec.call("zero", opt.zero_grad)
        rec["all_none"] = [p.grad is None for p in ps]
    rec.call("e_tensor", Optimizer, ps[0], lr=0.1)

    class HasParams:
        def parameters(self):
            return ps
    rec.call("e_module", Optimizer, HasParams(), lr=0.1)
    rec.call("e_iter", Optimizer, 3, lr=0.1)
    rec.call("e_empty", Optimizer, [], lr=0.1)
    rec.call("e_type", Optimizer, [ps[0], 2.0], lr=0.1)
    rec.call("e_nograd", Optimizer, [ps[0], Tensor(np.ones(2, dtype=np.float32))], lr=0.1)
    rec.call("e_leaf", Optimizer, [ps[0], ps[1] * 2.0], lr=0.1)
    rec.call("e_dup", Optimizer, [ps[0], ps[1], ps[0]], lr=0.1)


@probe("7.2", replay=INIT + ("SGD.step", "Adam.step"))
def state_dict(rng, rec):
    from tinytorch.core.optimizers import SGD, Adam

    ps = _params(rng)
    opt = SGD(ps, lr=0.1, momentum=0.9)
    _trajectory(rng, opt, ps, steps=2)
    sd = rec.call("sgd", opt.state_dict)
    _trajectory(rng, opt, ps, steps=1)
    rec["sgd_after_step"] = sd  # copies: a later step does not change it
    ps2 = _params(rng)
    adam = Adam(ps2, lr=0.01)
    _trajectory(rng, adam, ps2, steps=3)
    asd = rec.call("adam", adam.state_dict)
    fresh = Adam(_params(rng), lr=0.5)
    rec.call("load", fresh.load_state_dict, asd)
    rec["loaded_lr"] = getattr(fresh, "lr", None)
    rec.call("loaded", fresh.state_dict)
    if asd is not None:
        import copy
        import json

        text = copy.deepcopy(asd)
        text["state"] = {str(k): v for k, v in text["state"].items()}  # positions as a JSON file gives them back
        rec.call("load_strkeys", Adam(_params(rng), lr=0.5).load_state_dict, text)
        for key, change in (("e_missing", lambda d: d.pop("state")), ("e_class", lambda d: d.update(optimizer="SGD")),
                            ("e_hp", lambda d: d["hyperparameters"].pop("eps")),
                            ("e_pos", lambda d: d["state"].update({5: d["state"][0]})),
                            ("e_names", lambda d: d["state"][0].pop("exp_avg")),
                            ("e_shape", lambda d: d["state"][1].update(exp_avg=np.zeros(7))),
                            ("e_lr_then_bad", lambda d: (d["hyperparameters"].update(lr=0.123),
                                                         d["state"][1].update(exp_avg_sq=np.zeros(9))))):
            bad = copy.deepcopy(asd)
            change(bad)
            target = Adam(_params(rng), lr=0.5)
            rec.call(key, target.load_state_dict, bad)
            rec[key + "_unchanged"] = [getattr(target, "lr", None), len(getattr(target, "state", {}))]
        json.dumps(0)


@probe("7.3", replay=INIT)
def sgd(rng, rec):
    from tinytorch.core.optimizers import SGD

    for key, kw in (("plain", {}), ("momentum", {"momentum": 0.9}), ("damp", {"momentum": 0.8, "dampening": 0.3}),
                    ("nesterov", {"momentum": 0.9, "nesterov": True}), ("wd", {"momentum": 0.5, "weight_decay": 0.1})):
        ps = _params(rng)
        rec.call(key, _trajectory, rng, SGD(ps, lr=0.05, **kw), ps, 4, 1)


@probe("7.4", replay=INIT)
def adam(rng, rec):
    from tinytorch.core.optimizers import Adam

    for key, kw in (("plain", {}), ("betas", {"betas": (0.5, 0.9), "lr": 0.01}), ("wd", {"weight_decay": 0.1}),
                    ("eps", {"eps": 1e-3})):
        ps = _params(rng)
        rec.call(key, _trajectory, rng, Adam(ps, **kw), ps, 5, 1)


@probe("7.5", replay=INIT + ("Adam.step",))
def adamw(rng, rec):
    from tinytorch.core.optimizers import AdamW

    for key, kw in (("plain", {}), ("wd", {"weight_decay": 0.1, "lr": 0.01})):
        ps = _params(rng)
        rec.call(key, _trajectory, rng, AdamW(ps, **kw), ps, 4, 1)

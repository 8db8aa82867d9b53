"""One SVG diagram per module for the lab guide, drawn from code at build time.

`write_diagrams(root, modules, out)` writes `out/NN_name.svg` for every module and returns, per module
slug, the file name, its alt text (what the picture shows, objectively) and its caption. A module
with a drawing of its own below gets it; every other module (and each new one, as it lands) gets its
prerequisite graph, drawn from `module.toml` with `tinytorch.viz.graph`. A drawing that fails (a
student edition whose stubs are not written yet) falls back to the prerequisite graph too. Every SVG
ends with a newline and is the same file for the same inputs (no dates, a fixed hash salt).
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

DIAGRAMS = {}  # module name -> function(out_path) -> (alt, caption)


def diagram(name):
    def register(fn):
        DIAGRAMS[name] = fn
        return fn
    return register


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "tinytorch-guide", "svg.fonttype": "none", "font.size": 10})
    return plt


def _save(fig, path: Path) -> None:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


@diagram("tensor")
def strides(path: Path):
    """A 3x4 float32 tensor, its one buffer, and the strides of the tensor and of its transpose."""
    from tinytorch.core.tensor import Tensor

    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    s, st = a.data.strides, a.data.T.strides
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i in range(3):
        for j in range(4):
            ax.add_patch(plt.Rectangle((j, 3 - i), 1, 1, fill=True, fc="#dde8f6", ec="#1f4e8c"))
            ax.text(j + 0.5, 3.5 - i, f"{int(a.data[i, j])}", ha="center", va="center")
    ax.text(2, 4.3, f"logical view: shape (3, 4), strides {s} bytes", ha="center")
    for k in range(12):
        ax.add_patch(plt.Rectangle((5.5 + k * 0.55, 2), 0.55, 0.8, fc="#fde9c9", ec="#8a5a00"))
        ax.text(5.775 + k * 0.55, 2.4, str(k), ha="center", va="center", fontsize=8)
    ax.text(8.8, 3.1, "memory: one buffer of 12 float32 (48 bytes)", ha="center")
    ax.annotate("", xy=(5.5 + 4 * 0.55 + 0.27, 1.95), xytext=(5.5 + 0.27, 1.95),
                arrowprops=dict(arrowstyle="->", color="#1f4e8c"))
    ax.text(6.9, 1.55, f"next row: +{s[0]} bytes", ha="center", fontsize=9, color="#1f4e8c")
    ax.text(8.8, 0.9, f"transpose: shape (4, 3), strides {st}: the same buffer, no copy", ha="center")
    ax.set_xlim(-0.2, 12.3)
    ax.set_ylim(0.5, 4.6)
    ax.axis("off")
    _save(fig, path)
    return (f"Left, a 3 by 4 grid holding 0 to 11 row by row; right, the same numbers as one row of 12 memory "
            f"cells. An arrow shows that the next row starts {s[0]} bytes later; a note says the transpose has "
            f"strides {st} over the same buffer."), "One buffer, two views: shape and strides decide how a tensor reads its memory."


@diagram("activations")
def activation_curves(path: Path):
    from tinytorch.core.activations import GELU, ReLU, Sigmoid, Tanh
    from tinytorch.core.tensor import Tensor

    x = np.linspace(-4, 4, 161, dtype=np.float32)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for cls, style in ((ReLU, "-"), (Sigmoid, "--"), (Tanh, "-."), (GELU, ":")):
        ax.plot(x, cls()(Tensor(x)).data, style, label=cls.__name__, linewidth=2)
    ax.set_xlabel("input x")
    ax.set_ylabel("activation(x)")
    ax.axhline(0, color="#999", linewidth=0.6)
    ax.legend()
    ax.grid(alpha=0.3)
    _save(fig, path)
    return ("Line plot of four activation functions for x from -4 to 4. ReLU is 0 for negative x and rises "
            "linearly after 0; GELU follows it but dips slightly below 0 near x = -0.75; sigmoid rises from "
            "near 0 to near 1 and tanh from near -1 to near 1, both flattening at the ends."), \
        "ReLU, sigmoid, tanh and GELU, computed by this module's classes."


@diagram("autograd")
def computational_graph(path: Path):
    from tinytorch.core.losses import MSELoss
    from tinytorch.core.tensor import Tensor
    from tinytorch.viz.graph import draw_graph

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 3)).astype(np.float32))
    w = Tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    b = Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)
    y = Tensor(np.zeros((4, 2), dtype=np.float32))
    h = x @ w + b
    loss = MSELoss()(h, y)
    g = draw_graph(loss, names={"x": x, "w": w, "b": b, "y": y, "h": h, "loss": loss}, engine="svg", path=path)
    ops = [n["label"].split("(")[0] for n in g.nodes if n["kind"] == "op"]
    return (f"Graph drawn left to right: boxes for the tensors x, w, b and y, ellipses for the ops "
            f"{', '.join(ops)}, arrows from each input to the op that reads it, ending in the loss; "
            f"w and b are marked leaf."), \
        "The op records behind an MSE loss, drawn by draw_graph from a real Tensor."


@diagram("optimizers")
def optimizer_memory(path: Path):
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.activations import ReLU
    from tinytorch.core.optimizers import SGD, Adam

    def state_bytes(make):
        model = Sequential(Linear(784, 256, rng=0), ReLU(), Linear(256, 10, rng=0))
        params = model.parameters()
        for p in params:
            p.grad = type(p)(np.ones_like(p.data))
        opt = make(params)
        opt.step()
        weights = sum(p.data.nbytes for p in params)
        state = sum(v.nbytes for s in opt.state.values() for v in (s.values() if isinstance(s, dict) else [s])
                    if hasattr(v, "nbytes"))
        return weights, weights, state

    rows = {"SGD": state_bytes(lambda p: SGD(p, lr=0.1)),
            "SGD + momentum": state_bytes(lambda p: SGD(p, lr=0.1, momentum=0.9)),
            "Adam": state_bytes(lambda p: Adam(p, lr=1e-3))}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(rows)
    left = np.zeros(len(names))
    for k, (label, color) in enumerate((("weights", "#1f4e8c"), ("gradients", "#7aa6d6"), ("optimizer state", "#e0a040"))):
        vals = np.array([rows[n][k] for n in names]) / 2**20
        ax.barh(names, vals, left=left, color=color, label=label)
        left += vals
    ax.set_xlabel("memory of a 784-256-10 MLP (MiB)")
    ax.legend(loc="lower right", fontsize=8)
    _save(fig, path)
    ratios = {n: sum(rows[n]) / rows[n][0] for n in names}
    return ("Horizontal stacked bars of training memory for three optimizers on the same MLP: weights, "
            "gradients and optimizer state. SGD has no state (" + f"{ratios['SGD']:.0f}x the weights), momentum adds "
            f"one buffer ({ratios['SGD + momentum']:.0f}x), Adam two ({ratios['Adam']:.0f}x): the bars grow from "
            "SGD to Adam."), "Training memory per optimizer, measured from the optimizers' own state."


@diagram("attention")
def attention_weights(path: Path):
    n = 8
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((n, n))
    allowed = np.tril(np.ones((n, n), dtype=bool))
    scores = np.where(allowed, scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    im = ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    fig.colorbar(im, ax=ax, label="attention weight")
    _save(fig, path)
    return ("Heat map of an 8 by 8 causal attention matrix: rows are query positions, columns key positions. "
            "Cells above the diagonal (future keys) are 0; each row's weights sum to 1, so the first row puts "
            "all its weight on key 0 and later rows spread it thinner."), \
        "Causal attention weights: one row per query, N x N entries in all."


def prerequisite_graph(root: Path, module, modules, path: Path):
    """The module and the modules it builds on (its prerequisites and theirs), as a graph."""
    from tinytorch.viz.graph import layout_svg

    by_number = {m.number: m for m in modules}
    needed, stack = set(), list(module.prerequisites)
    while stack:
        p = stack.pop()
        if p not in needed and p in by_number:
            needed.add(p)
            stack.extend(by_number[p].prerequisites)
    chosen = [m for m in modules if m.number in needed] + [module]

    def below(number: str) -> set[str]:  # every module `number` builds on, directly or not
        seen, todo = set(), list(by_number[number].prerequisites) if number in by_number else []
        while todo:
            p = todo.pop()
            if p not in seen and p in by_number:
                seen.add(p)
                todo.extend(by_number[p].prerequisites)
        return seen

    def direct(m) -> list[str]:  # prerequisites not already reached through another one (module.toml lists all)
        ps = [p for p in m.prerequisites if p in by_number]
        return [p for p in ps if not any(p in below(q) for q in ps if q != p)]

    nodes = [{"id": f"m{m.number}", "kind": "op" if m is module else "tensor",
              "label": f"{m.number} {m.title}"} for m in chosen]
    edges = [(f"m{p}", f"m{m.number}") for m in chosen for p in direct(m)]
    path.write_text(layout_svg(nodes, edges), encoding="utf-8")
    if needed:
        names = ", ".join(f"{p} {by_number[p].title}" for p in direct(module))
        alt = (f"Graph drawn left to right: boxes for the {len(needed)} modules that module {module.number} builds on, "
               f"arrows from each module to the modules that need it, ending in an ellipse for module "
               f"{module.number} {module.title}, which builds directly on {names}.")
    else:
        alt = f"A single ellipse for module {module.number} {module.title}: it builds on no other module."
    return alt, f"What module {module.number} builds on: its prerequisites, from module.toml."


def write_diagrams(root: Path, modules, out: Path) -> dict[str, dict]:
    """Write one SVG per module into `out`; returns {slug: {file, alt, caption, kind}}."""
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for m in modules:
        path = out / f"{m.slug}.svg"
        kind = "own"
        try:
            if m.name not in DIAGRAMS:
                raise LookupError(m.name)
            alt, caption = DIAGRAMS[m.name](path)
        except Exception:  # no drawing of its own, or its code is not written yet (a student edition)
            kind = "prerequisites"
            alt, caption = prerequisite_graph(root, m, modules, path)
        text = path.read_text(encoding="utf-8")
        if not text.endswith("\n"):
            path.write_text(text + "\n", encoding="utf-8")
        result[m.slug] = {"file": path.name, "alt": alt, "caption": caption, "kind": kind}
    return result

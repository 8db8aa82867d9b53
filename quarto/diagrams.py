"""One SVG diagram per module for the lab guide: the module's central idea, drawn at build time from the
course's own objects (a Tensor's op records, a profiler's per-op records, a compiler graph before and
after fusion, a paged KV cache's block table, ...).

`write_diagrams(root, modules, out)` writes `out/NN_name.svg` for every module and returns, per module
slug, the file name, its alt text (what the picture shows, objectively), its caption and its kind
("own", or "prerequisites" for the fallback). Each drawing is a small function below that uses the
package's public names only; when one of them moves, the drawing raises and the build fails with the
module and the error (`DiagramError`), so a renamed API cannot silently turn a chapter's figure into
its prerequisite graph. Only a student edition, whose stubs raise NotImplementedError, falls back to
the prerequisite graph (drawn from `module.toml`) until the code is written. Every SVG ends with a
newline and is the same file for the same inputs (no dates, a fixed hash salt, seeded data).

Labels are set at 10 points or more on figures at most 7.5 inches wide, so they stay legible when the
figure is scaled to the page's column.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

DIAGRAMS = {}  # module name -> function(out_path) -> (alt, caption)
FONT = 10  # points: the smallest text of any diagram
MAX_WIDTH_IN = 7.5


class DiagramError(RuntimeError):
    """A module's diagram could not be drawn from the course's code (an API moved)."""


def diagram(name):
    def register(fn):
        DIAGRAMS[name] = fn
        return fn
    return register


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "tinytorch-guide", "svg.fonttype": "none", "font.size": FONT + 1,
                         "axes.titlesize": FONT + 1, "axes.labelsize": FONT + 1, "xtick.labelsize": FONT,
                         "ytick.labelsize": FONT, "legend.fontsize": FONT})
    return plt


def _save(fig, path: Path) -> None:
    w = fig.get_size_inches()[0]
    if w > MAX_WIDTH_IN:
        raise DiagramError(f"{path.name}: the figure is {w:.1f} inches wide; at most {MAX_WIDTH_IN} keeps its labels legible")
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def _plain_log_ticks(*axes) -> None:
    """Tick labels of log axes as plain numbers (0.1, 1, 10): the superscripts of 10^n are too small to read."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in axes:
        axis.set_major_formatter(fmt)


def _ranks(ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """The longest path from a source to each node (inputs before the ops that read them)."""
    rank = {i: 0 for i in ids}
    for _ in range(len(ids)):
        changed = False
        for a, b in edges:
            if rank[b] < rank[a] + 1:
                rank[b], changed = rank[a] + 1, True
        if not changed:
            break
    return rank


def draw_dag(ax, nodes: list[dict], edges: list[tuple[str, str]], width: float = 10.0, row: float = 1.0,
             colors=None) -> dict:
    """Draw a small graph top to bottom on `ax`: `nodes` are dicts with `id`, `label` and `kind` ("op" drawn
    round, anything else square); returns {id: (x, y)}. Rows are the nodes' ranks, so the picture grows
    downwards and its labels keep their size however long the program is."""
    colors = colors or {"op": ("#fde9c9", "#8a5a00"), "tensor": ("#dde8f6", "#1f4e8c")}
    rank = _ranks([n["id"] for n in nodes], edges)
    rows: dict[int, list[dict]] = {}
    for n in nodes:
        rows.setdefault(rank[n["id"]], []).append(n)
    pos = {}
    for r, ns in rows.items():
        for k, n in enumerate(ns):
            pos[n["id"]] = ((k + 0.5) * width / len(ns), -r * row)
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.annotate("", xy=(x1, y1 + 0.22 * row), xytext=(x0, y0 - 0.22 * row),
                    arrowprops=dict(arrowstyle="->", color="#555", lw=1))
    for n in nodes:
        x, y = pos[n["id"]]
        fc, ec = colors.get(n.get("kind"), colors["tensor"])
        style = "round,pad=0.35" if n.get("kind") == "op" else "square,pad=0.35"
        ax.text(x, y, n["label"], ha="center", va="center", fontsize=FONT,
                bbox=dict(boxstyle=style, fc=fc, ec=ec))
    ax.set_xlim(0, width)
    ax.set_ylim(-(max(rank.values()) + 0.6) * row, 0.6 * row)
    ax.axis("off")
    return pos


@diagram("tensor")
def strides(path: Path):
    """A 3x4 float32 tensor, its one buffer, and the strides of the tensor and of its transpose."""
    from tinytorch.core.tensor import Tensor

    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    s, st = a.data.strides, a.data.T.strides
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    for i in range(3):
        for j in range(4):
            ax.add_patch(plt.Rectangle((j, 3 - i), 1, 1, fill=True, fc="#dde8f6", ec="#1f4e8c"))
            ax.text(j + 0.5, 3.5 - i, f"{int(a.data[i, j])}", ha="center", va="center")
    ax.text(2, 4.3, f"logical view: shape (3, 4), strides {s} bytes", ha="center")
    for k in range(12):
        ax.add_patch(plt.Rectangle((5.5 + k * 0.55, 2), 0.55, 0.8, fc="#fde9c9", ec="#8a5a00"))
        ax.text(5.775 + k * 0.55, 2.4, str(k), ha="center", va="center", fontsize=FONT)
    ax.text(8.8, 3.1, "memory: one buffer of 12 float32 (48 bytes)", ha="center")
    ax.annotate("", xy=(5.5 + 4 * 0.55 + 0.27, 1.95), xytext=(5.5 + 0.27, 1.95),
                arrowprops=dict(arrowstyle="->", color="#1f4e8c"))
    ax.text(6.9, 1.55, f"next row: +{s[0]} bytes", ha="center", fontsize=FONT, color="#1f4e8c")
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
    """The op records behind a small MSE loss, as tinytorch.viz.graph reads them from a real Tensor."""
    from tinytorch.core.losses import MSELoss
    from tinytorch.core.tensor import Tensor
    from tinytorch.viz.graph import graph_nodes

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 3)).astype(np.float32))
    w = Tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    b = Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)
    y = Tensor(np.zeros((4, 2), dtype=np.float32))
    h = x @ w + b
    loss = MSELoss()(h, y)
    nodes, edges = graph_nodes(loss, names={"x": x, "w": w, "b": b, "y": y, "h": h, "loss": loss})
    for n in nodes:
        n["label"] = n["label"].replace(" | ", "\n")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.2))
    draw_dag(ax, nodes, edges, width=8, row=1.3)
    _save(fig, path)
    ops = [n["label"].split("(")[0] for n in nodes if n["kind"] == "op"]
    return (f"Graph drawn top to bottom: square boxes for the tensors x, w, b and y with their shapes, round "
            f"boxes for the ops {', '.join(ops)}, arrows from each input to the op that reads it and from each op "
            f"to its result, ending in the scalar loss; w and b are marked leaf."), \
        "The op records behind an MSE loss, read from a real Tensor by graph_nodes (tinytorch.viz.graph)."


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
    ax.legend(loc="lower right")
    _save(fig, path)
    ratios = {n: sum(rows[n]) / rows[n][0] for n in names}
    return ("Horizontal stacked bars of training memory for three optimizers on the same MLP: weights, "
            "gradients and optimizer state. SGD has no state (" + f"{ratios['SGD']:.0f}x the weights), momentum adds "
            f"one buffer ({ratios['SGD + momentum']:.0f}x), Adam two ({ratios['Adam']:.0f}x): the bars grow from "
            "SGD to Adam."), "Training memory per optimizer, measured from the optimizers' own state."


@diagram("layers")
def mlp_layers(path: Path):
    """A 784-256-10 MLP as its layers: the shapes flowing through and each layer's parameters and FLOPs."""
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential

    model = Sequential(Linear(784, 256, rng=0), ReLU(), Linear(256, 10, rng=0))
    batch = 64
    nodes, edges, shape, prev = [], [], (batch, 784), "in"
    nodes.append({"id": "in", "kind": "tensor", "label": f"input batch {shape[0]} x {shape[1]}"})
    total = 0
    for i, layer in enumerate(model.layers):
        if isinstance(layer, Linear):
            out_f, in_f = layer.weight.shape
            params = sum(int(np.prod(p.shape)) for p in layer.parameters())
            total += params
            flops = 2 * batch * in_f * out_f
            label = (f"Linear({in_f}, {out_f}): W {out_f} x {in_f} + b {out_f}\n"
                     f"{params:,} parameters, {params * 4 / 2**10:,.0f} KiB; {flops / 1e6:.1f} MFLOP per batch")
            shape = (batch, out_f)
        else:
            label = f"{type(layer).__name__}: elementwise, no parameters"
        nid = f"l{i}"
        nodes.append({"id": nid, "kind": "op", "label": label})
        edges.append((prev, nid))
        tid = f"t{i}"
        nodes.append({"id": tid, "kind": "tensor", "label": f"{shape[0]} x {shape[1]}"})
        edges.append((nid, tid))
        prev = tid
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    draw_dag(ax, nodes, edges, width=8, row=0.85)
    _save(fig, path)
    return (f"Flow drawn top to bottom: an input batch of 64 by 784 goes through Linear(784, 256), ReLU and "
            f"Linear(256, 10), each box stating its weight shape, parameter count, memory and FLOPs; the "
            f"activations between them are 64 by 256 and 64 by 10. The model holds {total:,} parameters, "
            f"almost all in the first layer."), \
        "An MLP as the Sequential of this module: shapes, parameters and FLOPs per layer, read from the layers."


@diagram("losses")
def stable_cross_entropy(path: Path):
    """Cross-entropy of one sample as its logits grow: the module's log-sum-exp form against the naive formula."""
    import warnings

    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.tensor import Tensor

    scales = np.geomspace(1, 1000, 60).astype(np.float32)
    loss = CrossEntropyLoss()
    stable, naive = [], []
    for s in scales:
        logits = np.array([[s, 0.0, -s]], dtype=np.float32)
        stable.append(float(loss(Tensor(logits), Tensor(np.array([1]))).data))
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            e = np.exp(logits)
            naive.append(float(-np.log(e[0, 1] / e.sum())))
    naive = np.array(naive)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(scales, stable, "-", lw=2.5, label="CrossEntropyLoss (log-sum-exp)")
    ok = np.isfinite(naive)
    ax.plot(scales[ok], naive[ok], "--", lw=2, label="naive: -log(exp(z_y) / sum exp(z))")
    broke = scales[~ok][0] if (~ok).any() else None
    if broke is not None:
        ax.axvline(broke, color="#c92a2a", lw=1)
        ax.text(broke * 1.1, max(stable) * 0.5, f"naive: inf/nan\nfrom z = {broke:.0f}", color="#c92a2a")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("logit scale z (logits z, 0, -z; target class 1)")
    ax.set_ylabel("loss (nats)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    _save(fig, path)
    where = f"the naive line stops at z = {broke:.0f}, where exp overflows float32" if broke is not None else "both stay finite"
    return (f"Line plot, logit scale on a log x-axis from 1 to 1000, loss in nats on the y-axis: the module's "
            f"cross-entropy grows linearly with the scale; {where}."), \
        "Cross-entropy from logits in float32: the log-sum-exp form stays finite where the textbook formula overflows."


@diagram("dataloader")
def batches(path: Path):
    """Which samples land in which batch: DataLoader over 10 samples, batch 4, shuffled with a seed."""
    from tinytorch.core.tensor import Tensor
    from tinytorch.data.loader import DataLoader, TensorDataset

    n = 10
    ds = TensorDataset(Tensor(np.arange(n, dtype=np.float32)))
    epochs = []
    for drop_last in (False, True):
        loader = DataLoader(ds, batch_size=4, shuffle=True, seed=0, drop_last=drop_last)
        epochs.append([[int(v) for v in np.asarray((b[0] if isinstance(b, (tuple, list)) else b).data).ravel()]
                       for b in loader])
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 2.8))
    for ax, ep, title in zip(axes, epochs, ("drop_last=False", "drop_last=True")):
        for r, batch in enumerate(ep):
            for c, v in enumerate(batch):
                ax.add_patch(plt.Rectangle((c, -r), 0.92, 0.8, fc="#dde8f6", ec="#1f4e8c"))
                ax.text(c + 0.46, -r + 0.4, str(v), ha="center", va="center")
            ax.text(-0.2, -r + 0.4, f"batch {r}", ha="right", va="center")
        ax.set_title(title)
        ax.set_xlim(-2.2, 4.2)
        ax.set_ylim(-3.3, 1.0)
        ax.axis("off")
    _save(fig, path)
    sizes = [[len(b) for b in ep] for ep in epochs]
    return (f"Two grids of numbered cells, one row per batch: the 10 sample indices of a dataset in the order a "
            f"shuffled DataLoader with batch size 4 and seed 0 yields them; batch sizes {sizes[0]} without "
            f"drop_last and {sizes[1]} with it, the last partial batch dropped."), \
        "One epoch of a shuffled DataLoader: sample indices per batch, with and without drop_last."


@diagram("training")
def lr_schedules(path: Path):
    """The learning rate per step of the module's three schedules."""
    from tinytorch.core.layers import Linear
    from tinytorch.core.optimizers import SGD
    from tinytorch.core.training import CosineAnnealingLR, LinearWarmup, StepLR

    steps = np.arange(0, 100)
    make = {"StepLR(step_size=30, gamma=0.5)": lambda o: StepLR(o, step_size=30, gamma=0.5),
            "CosineAnnealingLR(T_max=100)": lambda o: CosineAnnealingLR(o, T_max=100),
            "LinearWarmup(warmup_steps=20)": lambda o: LinearWarmup(o, warmup_steps=20)}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for (label, f), style in zip(make.items(), ("-", "--", "-.")):
        sched = f(SGD(Linear(2, 2, rng=0).parameters(), lr=0.1))
        ax.plot(steps, [sched.lr_at(int(t)) for t in steps], style, lw=2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.legend()
    ax.grid(alpha=0.3)
    _save(fig, path)
    return ("Line plot of the learning rate over 100 steps, starting at 0.1: StepLR halves it every 30 steps in "
            "stairs, CosineAnnealingLR falls along a half cosine to 0, LinearWarmup rises linearly from 0.01 to "
            "0.1 over 20 steps and then stays."), \
        "The learning rate per step of this module's schedules, from their own lr_at."


@diagram("convolutions")
def im2col_picture(path: Path):
    """im2col: every 3x3 patch of a 4x4 image becomes a column, so the convolution is one matmul."""
    from tinytorch.core.spatial import im2col

    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    res = im2col(x, 3)
    cols = np.asarray(res[0] if isinstance(res, tuple) else res)
    cols2 = cols.reshape(-1, cols.shape[-1]) if cols.ndim > 2 else cols
    if cols2.shape[0] != 9:
        cols2 = cols2.T
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.2, 3.4), gridspec_kw={"width_ratios": [1, 1.3]})
    for i in range(4):
        for j in range(4):
            inside = i < 3 and j < 3
            a.add_patch(plt.Rectangle((j, 3 - i), 1, 1, fc="#fde9c9" if inside else "#f1f3f5", ec="#555"))
            a.text(j + 0.5, 3.5 - i, str(int(x[0, 0, i, j])), ha="center", va="center")
    a.set_title("input 4 x 4 (first 3 x 3 patch shaded)")
    a.set_xlim(0, 4)
    a.set_ylim(0, 4)
    a.set_aspect("equal")
    a.axis("off")
    rows, ncols = cols2.shape
    for r in range(rows):
        for c in range(ncols):
            b.add_patch(plt.Rectangle((c, rows - 1 - r), 1, 1, fc="#fde9c9" if c == 0 else "#dde8f6", ec="#555"))
            b.text(c + 0.5, rows - 0.5 - r, str(int(cols2[r, c])), ha="center", va="center")
    b.set_title(f"im2col: {rows} x {ncols}, one column per patch")
    b.set_xlim(0, ncols)
    b.set_ylim(0, rows)
    b.set_aspect("equal")
    b.axis("off")
    _save(fig, path)
    return (f"Left, a 4 by 4 grid holding 0 to 15 with its top-left 3 by 3 patch shaded; right, the {rows} by "
            f"{ncols} matrix im2col makes of it, each column one patch read row by row, the first column the "
            f"shaded patch (0, 1, 2, 4, 5, 6, 8, 9, 10)."), \
        "im2col turns every patch into a column: a convolution becomes one matrix product, paid for in memory."


@diagram("tokenization")
def bpe_merges(path: Path):
    """A word taken apart by a trained BPE tokenizer, merge by merge."""
    from tinytorch.text.tokenizers import BPETokenizer

    text = "low lower lowest newer newest wider widest slow slower slowest " * 30
    full = BPETokenizer().train(text, vocab_size=256 + 10)
    word = " slowest"
    steps = []
    for k in range(0, len(full.merges) + 1):
        tok = BPETokenizer.from_merges(full.merges[:k]) if k else BPETokenizer.from_merges([])
        pieces = [tok.decode([i]) for i in tok.encode(word)]
        if not steps or pieces != steps[-1][1]:
            steps.append((k, pieces))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 0.55 * len(steps) + 0.6))
    for r, (k, pieces) in enumerate(steps):
        x = 0.0
        ax.text(-0.2, -r, f"{k} merges", ha="right", va="center")
        for p in pieces:
            w = 0.32 * max(len(p), 1) + 0.25
            ax.add_patch(plt.Rectangle((x, -r - 0.32), w - 0.08, 0.64, fc="#dde8f6", ec="#1f4e8c"))
            ax.text(x + (w - 0.08) / 2, -r, repr(p)[1:-1].replace(" ", "\u2423"), ha="center", va="center",
                    family="monospace")
            x += w
    ax.set_xlim(-2.2, 4.5)
    ax.set_ylim(-len(steps) + 0.4, 0.6)
    ax.axis("off")
    _save(fig, path)
    return (f"Rows of boxes, one row per point where a merge changed the word ' slowest' (the space shown as an "
            f"open box): {len(steps[0][1])} single characters with no merges, fewer and longer pieces as merges "
            f"are learned, {len(steps[-1][1])} tokens after {steps[-1][0]} merges."), \
        "Byte-pair encoding learned on a small text: the same word in fewer, longer tokens as merges accumulate."


@diagram("embeddings")
def positional_encoding(path: Path):
    """The sinusoidal position table: one row per position, one column per embedding dimension."""
    from tinytorch.text.embeddings import sinusoidal_positions

    table = np.asarray(sinusoidal_positions(64, 32))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    im = ax.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    ax.set_xlabel("embedding dimension")
    ax.set_ylabel("position in the sequence")
    fig.colorbar(im, ax=ax, label="value")
    _save(fig, path)
    return ("Heat map of a 64 by 32 table, positions down, dimensions across, values from -1 (red) to 1 (blue): "
            "the first columns alternate quickly down the rows, later columns ever more slowly, so every row is a "
            "different pattern."), \
        "Sinusoidal positional encodings: each position a distinct pattern, from fast to slow waves across dimensions."


@diagram("attention")
def attention_weights(path: Path):
    """Causal attention weights computed by the module's scaled_dot_product_attention."""
    from tinytorch.core.attention import attention_scores, causal_mask
    from tinytorch.core.tensor import Tensor

    n, d = 8, 4
    rng = np.random.default_rng(0)
    q = Tensor(rng.standard_normal((n, d)).astype(np.float32))
    k = Tensor(rng.standard_normal((n, d)).astype(np.float32))
    scores = np.asarray(attention_scores(q, k).data, dtype=np.float64)
    mask = np.asarray(causal_mask(n), dtype=bool)
    allowed = mask if mask[0, 0] else ~mask
    scores = np.where(allowed, scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.9))
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
        "Causal attention weights from this module's scores and mask: one row per query, N x N entries in all."


@diagram("transformers")
def gpt_parameters(path: Path):
    """Where a GPT's parameters are: embeddings, attention, MLP, LayerNorm, per named parameter."""
    from tinytorch.models.gpt import GPT

    model = GPT(vocab_size=65, context_length=128, embed_dim=96, num_heads=4, num_layers=2, rng=0)
    groups: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = ("attention" if "attn" in name else "MLP" if "mlp" in name else "LayerNorm" if "ln" in name or "norm" in name
               else "embeddings" if "emb" in name or "pos" in name else "output head" if "head" in name else name)
        groups[key] = groups.get(key, 0) + int(np.prod(p.shape))
    total = sum(groups.values())
    names = sorted(groups, key=groups.get)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    vals = [groups[k] for k in names]
    ax.barh(names, vals, color="#1f4e8c")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:,} ({v / total:.0%})", va="center")
    ax.set_xlabel(f"parameters (total {total:,})")
    ax.set_xlim(0, max(vals) * 1.45)
    _save(fig, path)
    top = names[-1]
    return (f"Horizontal bars of parameter counts in a 2-layer GPT with width 96, 4 heads and a 65-token "
            f"vocabulary, grouped as {', '.join(names)}; {top} is the largest share."), \
        "Where a small GPT's parameters are, counted from the model's own named_parameters."


@diagram("profiling")
def roofline_of_a_step(path: Path):
    """The ops of one GPT forward pass placed on a roofline, by the FLOPs and bytes the profiler records."""
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor
    from tinytorch.models.gpt import GPT
    from tinytorch.perf.profiler import Profiler, roofline

    model = GPT(vocab_size=65, context_length=32, embed_dim=64, num_heads=4, num_layers=1, rng=0)
    ids = Tensor(np.random.default_rng(0).integers(0, 65, (8, 32)))
    with no_grad(), Profiler(model, backward=False) as prof:
        model(ids)
    by_op: dict[str, list[float]] = {}
    for e in prof.events:
        if e.kind != "op" and getattr(e, "kind", "op") not in ("op", "forward"):
            continue
        f, b = float(e.flops or 0) + float(getattr(e, "other_flops", 0) or 0), float(e.bytes or 0)
        if f > 0 and b > 0:
            acc = by_op.setdefault(e.name, [0.0, 0.0])
            acc[0] += f
            acc[1] += b
    if not by_op:
        raise DiagramError("the profiler recorded no op with both FLOPs and bytes")
    peak, bw = 100e9, 20e9  # an example machine: 100 GFLOP/s, 20 GB/s (ridge at 5 FLOP/byte)
    xs = np.geomspace(0.05, 100, 200)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    ax.plot(xs, roofline(xs, peak, bw) / 1e9, "-", color="#333", lw=2, label="roofline of the example machine")
    markers = "osD^v<>ph*"
    for k, (name, (f, b)) in enumerate(sorted(by_op.items(), key=lambda kv: kv[1][0] / kv[1][1])):
        ai = f / b
        ax.plot([ai], [float(roofline(ai, peak, bw)) / 1e9], markers[k % len(markers)], ms=9,
                label=f"{name}: {ai:.2g} FLOP/byte")
    ax.axvline(peak / bw, color="#999", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable GFLOP/s")
    ax.legend(loc="lower right", ncol=2)
    ax.grid(alpha=0.3, which="both")
    _save(fig, path)
    mem = sorted(n for n, (f, b) in by_op.items() if f / b < peak / bw)
    return (f"Log-log roofline: attainable GFLOP/s against FLOPs per byte, a slanted memory roof meeting a flat "
            f"compute roof at 5 FLOP per byte for an example machine of 100 GFLOP/s and 20 GB/s. Each op of one GPT "
            f"forward pass sits at its intensity from the profiler's records; {', '.join(mem) or 'none'} fall left "
            f"of the ridge (memory-bound), matmul to the right."), \
        "Each op of a GPT forward pass on a roofline, placed by the FLOPs and bytes the module's Profiler records."


@diagram("quantization")
def int8_grid(path: Path):
    """INT8 affine quantization of a small weight vector: the grid its scale and zero-point make."""
    from tinytorch.perf.quantization import compute_qparams, dequantize, quantize, qrange

    rng = np.random.default_rng(0)
    w = (rng.standard_normal(400) * 0.05).astype(np.float32)
    scale, zp = compute_qparams(float(w.min()), float(w.max()), "int8")
    lo, hi = qrange("int8")
    back = dequantize(quantize(w, scale, zp, "int8"), scale, zp)
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.2, 3.4))
    xs = np.linspace(float(w.min()), float(w.max()), 2000, dtype=np.float32)
    a.plot(xs, dequantize(quantize(xs, scale, zp, "int8"), scale, zp), lw=1.5)
    a.set_xlabel("float32 value")
    a.set_ylabel("after int8 round trip")
    a.set_title(f"the whole range: {hi - lo + 1} levels")
    zoom = (xs > 0) & (xs < 6 * float(scale))
    b.step(xs[zoom], dequantize(quantize(xs[zoom], scale, zp, "int8"), scale, zp), where="mid", lw=2)
    b.plot(xs[zoom], xs[zoom], ":", color="#999")
    b.set_xlabel("float32 value (zoomed)")
    b.set_title(f"steps of scale = {float(scale):.2g}")
    _save(fig, path)
    err = float(np.abs(back - w).max())
    return (f"Two plots of the int8 round trip of 400 weights between {w.min():.2f} and {w.max():.2f}: over the "
            f"whole range the output follows the input as a straight line; zoomed to six steps it is a staircase "
            f"of width scale = {float(scale):.2g}, the largest error half a step ({err:.2g})."), \
        "INT8 affine quantization: scale and zero-point map the float range onto 256 levels; each value moves by at most half a step."


@diagram("compression")
def pruning_mask(path: Path):
    """Magnitude pruning at 80% sparsity: which weights of a layer stay."""
    from tinytorch.perf.compression import magnitude_mask

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    mask = np.asarray(magnitude_mask(w, 0.8), dtype=bool)
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.2, 2.8))
    a.imshow(np.abs(w), cmap="Greys")
    a.set_title("|weight|, 16 x 32")
    b.imshow(mask, cmap="Blues")
    b.set_title(f"kept by magnitude_mask: {mask.mean():.0%}")
    for ax in (a, b):
        ax.set_xticks([])
        ax.set_yticks([])
    _save(fig, path)
    return (f"Two 16 by 32 grids: the magnitudes of a random weight matrix in grey, and the mask of the weights "
            f"magnitude pruning keeps at 80% sparsity, {mask.sum()} of {mask.size} cells, scattered without "
            f"pattern, which is why dense hardware gains nothing from them."), \
        "Unstructured magnitude pruning keeps the largest weights wherever they are: sparse, but irregular."


@diagram("acceleration")
def fusion(path: Path):
    """A traced elementwise program before and after the compiler's passes (fusion)."""
    from tinytorch.core.activations import GELU, ReLU
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import optimize, trace

    def f(x, b):
        h = x + b
        return GELU()(h) * 0.5 + ReLU()(h - 1.0)

    g = trace(f, Tensor(np.ones((64, 64), dtype=np.float32)), Tensor(np.ones(64, dtype=np.float32)))
    o = optimize(g)

    def graph(gr):
        nodes = [{"id": n, "kind": "tensor", "label": n} for n in gr.inputs]
        edges = []
        for node in gr.nodes:
            label = node.op if not node.body else "fused kernel:\n" + ", ".join(b.op for b in node.body)
            nodes.append({"id": node.name, "kind": "op", "label": f"{node.name} {label}"})
            edges += [(a, node.name) for a in node.args if isinstance(a, str) and a in {n["id"] for n in nodes}]
        return nodes, edges

    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(7.2, 5.0))
    for ax, gr, title in ((a, g, f"traced: {len(g.nodes)} ops"), (b, o, f"optimized: {len(o.nodes)} ops")):
        n, e = graph(gr)
        draw_dag(ax, n, e, width=4, row=1.0)
        ax.set_title(title)
    _save(fig, path)
    fused = [node for node in o.nodes if node.body]
    inner = ", ".join(x.op for x in fused[0].body) if fused else "none"
    return (f"Two graphs drawn top to bottom. Left, the traced program: inputs x0 and x1 and {len(g.nodes)} "
            f"elementwise ops, each writing an array to memory. Right, after the compiler's passes: "
            f"{len(o.nodes)} ops, the chain {inner} merged into one fused kernel that reads its input once."), \
        "Kernel fusion by this module's compiler: the traced graph before and after its passes."


@diagram("memoization")
def block_table(path: Path):
    """A paged KV cache shared by three sequences: each one's block table into one pool of blocks."""
    from tinytorch.perf.kv_cache import PagedKVCache

    cache = PagedKVCache(num_blocks=12, block_size=4, num_layers=1, num_heads=1, head_dim=2)
    for seq, n in (("A", 10), ("B", 5), ("C", 7)):
        cache.add_sequence(seq)
        cache.allocate(seq, n)
    cache.free("B")
    cache.add_sequence("D")
    cache.allocate("D", 10)
    tables = {s: list(t) for s, t in cache.block_tables.items()}
    owner = {b: s for s, t in tables.items() for b in t}
    colors = {"A": "#a5d8ff", "C": "#ffd8a8", "D": "#b2f2bb"}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    for r, (s, t) in enumerate(tables.items()):
        ax.text(-0.3, -r, f"sequence {s}", ha="right", va="center")
        for c, blk in enumerate(t):
            ax.add_patch(plt.Rectangle((c, -r - 0.35), 0.9, 0.7, fc=colors.get(s, "#eee"), ec="#333"))
            ax.text(c + 0.45, -r, str(blk), ha="center", va="center")
    y = -len(tables) - 0.8
    ax.text(-0.3, y, "pool of blocks", ha="right", va="center")
    for blk in range(cache.num_blocks):
        s = owner.get(blk)
        ax.add_patch(plt.Rectangle((blk * 0.6, y - 0.3), 0.55, 0.6, fc=colors.get(s, "#f8f9fa"), ec="#333"))
        ax.text(blk * 0.6 + 0.27, y, str(blk), ha="center", va="center", fontsize=FONT)
    ax.set_xlim(-3.2, 7.4)
    ax.set_ylim(y - 0.8, 0.8)
    ax.axis("off")
    _save(fig, path)
    return (f"Top, one row of numbered boxes per live sequence: the block ids of its table, in position order "
            f"(A {tables['A']}, C {tables['C']}, D {tables['D']}). Bottom, the pool of {cache.num_blocks} blocks "
            f"coloured by owner, {cache.num_free_blocks} free. Sequence B finished and D reused its blocks, so a "
            f"table need not be contiguous."), \
        "A paged KV cache: each sequence's block table points into one shared pool; a finished sequence's blocks are reused at once."


@diagram("benchmarking")
def bootstrap_interval(path: Path):
    """Latency samples with their median and the bootstrap confidence interval the module computes."""
    from tinytorch.perf.benchmark import bootstrap_median_ci

    rng = np.random.default_rng(0)
    samples = np.exp(rng.normal(np.log(1e-3), 0.15, 60)) + (rng.random(60) < 0.08) * 1.5e-3
    lo, hi = bootstrap_median_ci(samples, rng=np.random.default_rng(1))[:2]
    med = float(np.median(samples))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.hist(samples * 1e3, bins=30, color="#a5d8ff", ec="#1f4e8c")
    ax.axvline(med * 1e3, color="#c92a2a", lw=2, label=f"median {med * 1e3:.2f} ms")
    ax.axvspan(lo * 1e3, hi * 1e3, color="#c92a2a", alpha=0.2, label=f"95% interval {lo * 1e3:.2f}-{hi * 1e3:.2f} ms")
    ax.set_xlabel("time per call (ms)")
    ax.set_ylabel("repeats")
    ax.legend()
    _save(fig, path)
    return (f"Histogram of 60 timings, most near 1 ms with a few slow outliers near 2.5 ms; a red line marks the "
            f"median, {med * 1e3:.2f} ms, and a shaded band its 95% bootstrap interval, "
            f"{lo * 1e3:.2f} to {hi * 1e3:.2f} ms, which the outliers barely move."), \
        "A benchmark reports a median with a bootstrap interval, not one timing: bootstrap_median_ci on 60 repeats."


@diagram("serving")
def dynamic_batching(path: Path):
    """Requests arriving at random, grouped into batches by the dynamic batcher's window (batch_window)."""
    from collections import deque

    from tinytorch.serving.loadgen import poisson_arrivals
    from tinytorch.serving.server import batch_window

    arrivals = poisson_arrivals(rate=400.0, n=40, duration=0.1, seed=0)
    max_batch, max_wait, service = 8, 0.01, 0.004
    pending, batches, t, i, busy_until = deque(), [], 0.0, 0, 0.0
    while i < len(arrivals) or pending:
        while i < len(arrivals) and arrivals[i] <= t:
            pending.append((float(arrivals[i]), i))
            i += 1
        if t >= busy_until:
            batch, _, _ = batch_window(pending, t, max_batch, max_wait)
            if batch:
                batches.append((t, [r for _, r in batch]))
                busy_until = t + service
        t += 0.0005
        if t > 1.0:
            raise DiagramError("batch_window never emptied the queue")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.2))
    palette = ("#1f4e8c", "#e8590c")
    for k, (start, reqs) in enumerate(batches):
        color = palette[k % 2]
        ax.add_patch(plt.Rectangle((start * 1e3, 0.2), service * 1e3, 0.6, fc="#f1f3f5", ec=color, lw=2))
        ax.text((start + service / 2) * 1e3, 0.5, str(len(reqs)), ha="center", va="center", color=color)
        ax.plot(arrivals[reqs] * 1e3, [-0.4] * len(reqs), "|", color=color, ms=14, mew=2)
    ax.set_yticks([-0.4, 0.5])
    ax.set_yticklabels(["requests\narrive", "batches\n(size)"])
    ax.set_xlabel("time (ms)")
    ax.set_ylim(-0.9, 1.1)
    _save(fig, path)
    sizes = [len(r) for _, r in batches]
    return (f"Timeline over about {arrivals[-1] * 1e3:.0f} ms: ticks for 40 requests arriving at random, coloured "
            f"by the batch that serves them, and boxes for the {len(batches)} batches the dynamic "
            f"batcher formed (at most 8 requests, waiting at most 10 ms), labelled with their sizes, "
            f"{min(sizes)} to {max(sizes)}."), \
        "Dynamic batching: batch_window groups randomly arriving requests, trading a few milliseconds of waiting for fewer, larger batches."


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


def write_diagrams(root: Path, modules, out: Path, strict: bool | None = None) -> dict[str, dict]:
    """Write one SVG per module into `out`; returns {slug: {file, alt, caption, kind}}. In the instructor
    edition (`strict`, read from settings.ini by default) a drawing that fails for any reason but a stub not
    written yet raises DiagramError naming the module; in a student edition, whose code may be half
    written, any failure falls back to the prerequisite graph."""
    if strict is None:
        from tito.course import Settings

        strict = Settings.load(root).edition == "instructor"
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for m in modules:
        path = out / f"{m.slug}.svg"
        kind = "own"
        if m.name in DIAGRAMS:
            try:
                alt, caption = DIAGRAMS[m.name](path)
            except NotImplementedError:  # a student edition: the module's code is not written yet
                kind = "prerequisites"
                alt, caption = prerequisite_graph(root, m, modules, path)
            except Exception as e:
                if not strict:
                    kind = "prerequisites"
                    alt, caption = prerequisite_graph(root, m, modules, path)
                    result[m.slug] = {"file": path.name, "alt": alt, "caption": caption, "kind": kind}
                    continue
                fn = DIAGRAMS[m.name].__name__
                raise DiagramError(f"quarto/diagrams.py {fn}() could not draw module {m.slug}'s diagram from the "
                                   f"course's code: {type(e).__name__}: {e}. If an API moved, update {fn}.") from e
        else:  # a module without a drawing of its own yet (a new module folder)
            kind = "prerequisites"
            alt, caption = prerequisite_graph(root, m, modules, path)
        text = path.read_text(encoding="utf-8")
        if not text.endswith("\n"):
            path.write_text(text + "\n", encoding="utf-8")
        result[m.slug] = {"file": path.name, "alt": alt, "caption": caption, "kind": kind}
    return result

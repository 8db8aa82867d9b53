"""1957: Rosenblatt's perceptron, rebuilt with your own tinytorch.

In 1957 Frank Rosenblatt, at the Cornell Aeronautical Laboratory, described the perceptron: a
weighted sum of inputs followed by a threshold, whose weights learn from mistakes alone with the
rule w += lr * (y - y_hat) * x. Built in hardware as the Mark I Perceptron, it learned to tell
simple shapes apart and was announced in the press as the start of machines that learn. The
perceptron convergence theorem (Rosenblatt; Novikoff, 1962) guarantees that the rule separates any
linearly separable data in a finite number of updates; in 1969 Minsky and Papert showed what a
single such layer cannot do (XOR), which is the next milestone.

This script uses Tensor (module 01), Linear (module 03) as the weight holder computing
x @ W.T + b, a step function as the threshold, and Sigmoid (module 02) to shade the plot. There is
no autograd: the update is Rosenblatt's rule, written with Tensor arithmetic.

    tito milestone run perceptron [--epochs 50] [--samples 200] [--seed 0] [--lr 0.1] [--quick] [--out PATH]
"""
NAME = "perceptron"
YEAR = 1957
TITLE = "Rosenblatt's perceptron learns a linearly separable set"
NEEDS = ["01", "02", "03"]
TARGET = "100% training accuracy within 50 epochs on a linearly separable set"
# what the harness checks (TARGET says it in words for people)
GOAL = {"reach": [("training accuracy", ">=", 1.0)], "max_epochs": 50}

import sys

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--samples", type=int, default=200, help="points in the data set (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate of the rule (default %(default)s)")


def make_blobs(n, rng, margin=0.15, spread=1.1):
    """Two Gaussian blobs on either side of a random line, pushed at least `margin` away from it.

    Returns float32 points (n, 2) and 0/1 labels (n, 1) as NumPy arrays; half the points per class.
    """
    import numpy as np

    angle = rng.uniform(0, 2 * np.pi)
    normal = np.array([np.cos(angle), np.sin(angle)])
    offset = rng.uniform(1.0, 2.0)  # the true line normal . x = offset misses the origin: the bias matters
    y = rng.permutation(np.arange(n) % 2)
    side = 2.0 * y - 1.0  # -1 / +1
    x = (offset + 1.5 * side)[:, None] * normal + rng.normal(0.0, spread, size=(n, 2))
    distance = x @ normal - offset  # signed distance to the true line
    x += (np.maximum(margin - side * distance, 0.0) * side)[:, None] * normal
    return x.astype(np.float32), y.astype(np.float32)[:, None]


def main(argv=None) -> int:
    run = harness.start(__file__, quick_epochs=5, options=options, argv=argv)  # epochs: TARGET's "within 50"
    args = run.args
    if args.samples < 2:
        raise SystemExit("error: --samples must be at least 2")

    import numpy as np

    from tinytorch.core.activations import Sigmoid
    from tinytorch.core.layers import Linear
    from tinytorch.core.tensor import Tensor

    class Step:
        """The perceptron's threshold unit: 1 where z >= 0, else 0."""

        def forward(self, z: Tensor) -> Tensor:
            return Tensor((z.data >= 0).astype(np.float32))

        def __call__(self, z: Tensor) -> Tensor:
            return self.forward(z)

    rng = np.random.default_rng(args.seed)
    x_np, y_np = make_blobs(args.samples, rng)
    X, Y = Tensor(x_np), Tensor(y_np)
    unit = Linear(2, 1, rng=rng)  # weight (1, 2), bias (1,): z = x @ W.T + b
    step = Step()

    def accuracy() -> float:
        # labels and predictions are 0/1, so the mean squared difference is the error rate
        return 1.0 - ((Y - step(unit(X))) ** 2).mean().item()

    print(f"data: {args.samples} points in 2-D, two linearly separable blobs (seed {args.seed}); "
          f"learning rate {args.lr}; at most {args.epochs} epoch(s)")
    initial = (unit.weight.data.copy(), unit.bias.data.copy() if unit.bias is not None else None)
    history, updates, acc, epochs_run = [], 0, accuracy(), 0
    watch = harness.Stopwatch()
    with run.progress() as progress:
        for epoch in range(1, args.epochs + 1):
            mistakes = 0
            for i in rng.permutation(args.samples):  # Rosenblatt's rule: one sample at a time
                xi, yi = X[i : i + 1], Y[i : i + 1]  # (1, 2), (1, 1)
                error = yi - step(unit(xi))  # y - y_hat: 0 when right, +1 or -1 when wrong
                if error.item() != 0:
                    unit.weight.data += (args.lr * (error.T @ xi)).data  # w += lr (y - y_hat) x
                    if unit.bias is not None:
                        unit.bias.data += (args.lr * error.sum(axis=0)).data  # b += lr (y - y_hat)
                    mistakes += 1
            updates += mistakes
            acc, epochs_run = accuracy(), epoch
            history.append(mistakes)
            progress.update(epoch, f"mistakes {mistakes:4d}   training accuracy {acc:6.1%}")
            if acc == 1.0:  # every point right: the rule makes no more updates
                break
    seconds = watch.stop()

    w, b = unit.weight.data[0], (unit.bias.data[0] if unit.bias is not None else 0.0)
    print(f"trained {epochs_run} epoch(s), {updates} weight update(s), in {seconds:.2f} s; "
          f"w = [{w[0]:.3f}, {w[1]:.3f}], b = {b:.3f}")
    run.save_plot(plot(run.pyplot(), x_np, y_np, unit, initial, Sigmoid(), Tensor, history, acc, epochs_run))
    return run.report(("training accuracy", acc), epochs=epochs_run)


def plot(plt, x_np, y_np, unit, initial, sigmoid, Tensor, history, acc, epochs_run):
    """Left: data, sigmoid(w.x + b) shading, boundary before and after. Right: mistakes per epoch."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    pad = 1.0
    lo, hi = x_np.min(axis=0) - pad, x_np.max(axis=0) + pad
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 200), np.linspace(lo[1], hi[1], 200))
    grid = Tensor(np.stack([gx.ravel(), gy.ravel()], axis=1))
    z = unit(grid)
    shade = sigmoid(z).data.reshape(gx.shape)  # sigmoid(w.x + b): how far and which side

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1.3, 1]})
    cs = ax.contourf(gx, gy, shade, levels=np.linspace(0, 1, 21), cmap="coolwarm", alpha=0.55)
    fig.colorbar(cs, ax=ax, label="sigmoid(w·x + b)")
    ax.contour(gx, gy, z.data.reshape(gx.shape), levels=[0.0], colors="black", linewidths=2)
    w0, b0 = initial  # the random starting line, for comparison
    z0 = grid.data @ w0.T + (b0 if b0 is not None else 0.0)
    ax.contour(gx, gy, z0.reshape(gx.shape), levels=[0.0], colors="dimgray", linewidths=1.2, linestyles="--")
    labels = y_np[:, 0]
    for cls, color, marker in ((0, "tab:blue", "o"), (1, "tab:red", "s")):
        pts = x_np[labels == cls]
        ax.scatter(pts[:, 0], pts[:, 1], c=color, marker=marker, edgecolors="k", linewidths=0.5, s=22,
                   label=f"class {cls}")
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal")
    ax.set_title(f"boundary w·x + b = 0: start (dashed), end (black); {acc:.1%} correct", fontsize=10)
    ax.legend(loc="best")
    ax2.bar(np.arange(1, len(history) + 1), history, color="tab:gray")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("mistakes (weight updates)")
    ax2.set_title(f"learning from mistakes: {epochs_run} epoch(s)")
    fig.suptitle(f"{YEAR} {NAME}: {TITLE}")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())

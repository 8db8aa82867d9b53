"""1969: XOR, the problem a single layer cannot solve, rebuilt with your own tinytorch.

In 1969 Marvin Minsky and Seymour Papert published "Perceptrons", a careful mathematical study of
what Rosenblatt's single-layer machines can compute. Its best-known result is also its simplest:
no single layer of threshold units computes XOR, because the points (0, 1) and (1, 0) must fall on
one side of a line and (0, 0) and (1, 1) on the other, and no line does that. A hidden layer
solves it, but nobody knew how to train one; the book is often blamed for a decade of lost
interest in neural networks. The answer, backpropagation of errors through the hidden layer, was
popularised by Rumelhart, Hinton and Williams in 1986.

This script trains both models on the four XOR points with your autograd (module 06), your SGD
(module 07) and your Trainer (module 08): a single Linear layer, which gets at most three of the
four points right, and a two-layer MLP (Linear, Tanh, Linear), which gets all four. The plot shows
both decision boundaries and both loss curves.

    tito milestone run xor [--epochs 300] [--hidden 4] [--lr 0.5] [--seed 0] [--quick] [--out PATH]
"""
NAME = "xor"
YEAR = 1969
TITLE = "XOR: a single layer fails, a hidden layer trained with backprop succeeds"
NEEDS = ["01", "02", "03", "04", "05", "06", "07", "08"]
TARGET = "a two-layer MLP reaches 100% accuracy on XOR, where a single layer stays at or below 75%"
# what the harness checks (TARGET says it in words for people)
GOAL = {"reach": [("two-layer MLP accuracy", ">=", 1.0), ("single-layer accuracy", "<=", 0.75)]}

import sys
import time

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--hidden", type=int, default=4, help="units in the hidden layer (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default %(default)s)")


def main(argv=None) -> int:
    run = harness.start(__file__, epochs=300, quick_epochs=150, options=options, argv=argv)
    args = run.args

    import numpy as np

    from tinytorch.core.activations import Tanh
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.optimizers import SGD
    from tinytorch.core.training import EpochProgress, Trainer, evaluate
    from tinytorch.data.loader import DataLoader, TensorDataset

    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float32)
    y = np.array([0, 1, 1, 0])  # XOR: 1 when exactly one input is 1
    data = DataLoader(TensorDataset(x * 2 - 1, y), batch_size=4)  # inputs centred at 0: +-1
    rng = np.random.default_rng(args.seed)
    models = {
        "single layer": Sequential(Linear(2, 2, init="xavier", rng=rng)),
        f"two-layer MLP ({args.hidden} hidden)": Sequential(
            Linear(2, args.hidden, init="xavier", rng=rng), Tanh(), Linear(args.hidden, 2, init="xavier", rng=rng)),
    }
    print(f"data: the 4 XOR points, inputs mapped to -1/+1; full-batch SGD (lr {args.lr}, momentum 0.9), "
          f"{args.epochs} epochs per model (seed {args.seed})")
    results = {}
    for name, model in models.items():
        trainer = Trainer(model, CrossEntropyLoss(), SGD(model.parameters(), lr=args.lr, momentum=0.9), progress=False)
        start = time.perf_counter()
        print(f"training the {name}:")
        with run.progress() as progress:
            history = trainer.fit(data, args.epochs,
                                  callback=lambda r: progress.update(r["epoch"], EpochProgress.describe(r)))
        final = evaluate(model, data, CrossEntropyLoss())
        results[name] = (model, [r["train_loss"] for r in history], final["accuracy"])
        print(f"  {name}: accuracy {final['accuracy']:.0%} (loss {final['loss']:.4f}) "
              f"after {args.epochs} epochs, {time.perf_counter() - start:.2f} s")

    run.save_plot(plot(run.pyplot(), x * 2 - 1, y, results))
    (single, _, single_acc), (mlp, _, mlp_acc) = results.values()
    return run.report(("two-layer MLP accuracy", mlp_acc), ("single-layer accuracy", single_acc))


def plot(plt, x, y, results):
    "Left two panels: each model's P(class 1) over the plane with the 4 points; right: both loss curves."
    import numpy as np

    from tinytorch.core.activations import Softmax
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor

    gx, gy = np.meshgrid(np.linspace(-2, 2, 161), np.linspace(-2, 2, 161))
    grid = Tensor(np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (name, (model, losses, acc)) in zip(axes, results.items()):
        with no_grad():
            prob = Softmax(dim=1)(model.eval()(grid)).data[:, 1].reshape(gx.shape)
        cs = ax.contourf(gx, gy, prob, levels=np.linspace(0, 1, 21), cmap="coolwarm", alpha=0.6)
        flat = prob.max() - prob.min() < 0.05  # the best a line can do under cross-entropy: 50/50 everywhere
        if not flat:
            ax.contour(gx, gy, prob, levels=[0.5], colors="black", linewidths=2)
        for cls, color, marker in ((0, "tab:blue", "o"), (1, "tab:red", "s")):
            pts = x[y == cls]
            ax.scatter(pts[:, 0], pts[:, 1], c=color, marker=marker, s=120, edgecolors="k", label=f"XOR = {cls}")
        ax.set_title(f"{name}: {acc:.0%} correct" + (f"\nP(XOR = 1) = {prob.mean():.2f} everywhere: no line works" if flat else ""),
                     fontsize=10)
        ax.set_xlabel("x1")
        ax.set_ylabel("x2")
        ax.set_aspect("equal")
        ax.legend(loc="lower left", fontsize=8)
    fig.colorbar(cs, ax=axes[1], label="P(XOR = 1)", shrink=0.85)
    for name, (_, losses, _) in results.items():
        axes[2].plot(np.arange(1, len(losses) + 1), losses, label=name)
    axes[2].axhline(np.log(2), color="gray", linestyle=":", label="ln 2 (a coin flip)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("epoch")
    axes[2].set_ylabel("cross-entropy")
    axes[2].set_title("training loss")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"{YEAR} {NAME}: {TITLE}")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())

"""1998: LeCun's convolutional network, rebuilt with your own tinytorch.

In 1989 Yann LeCun and colleagues at Bell Labs trained a network with backpropagation to read
handwritten ZIP codes, and instead of connecting every pixel to every hidden unit they made the
units share small filters slid across the image. In 1998 LeCun, Bottou, Bengio and Haffner
published LeNet-5 ("Gradient-based learning applied to document recognition"), whose
convolution, subsampling and fully connected layers read a large share of the cheques written in
the United States. The argument was the one this script measures: a network that builds in
locality and weight sharing needs fewer parameters than a fully connected one and generalises
better from the same images.

This script trains, on the same bundled digits split, with the same optimizer and epochs, the
1986 milestone's network (Flatten, Linear 64 -> 128, ReLU, Linear 128 -> 128, ReLU, Linear 128 -> 10)
and a small CNN (two Conv2d + BatchNorm2d + ReLU + MaxPool2d stages, then Linear), and compares their
test accuracy and parameter counts. Modules used: Tensor (01), ReLU (02), Linear and Sequential
(03), cross-entropy (04), the DataLoader and digits (05), autograd (06) and the convolutional layers
(09); the SGD-with-momentum step is written inline in a few lines. With `--cifar10 DIR` (the
python batches of CIFAR-10, unpacked) the same two models train on CIFAR-10 through the module 05
loader instead; the 60 s limit then does not apply.

    tito milestone run cnn [--epochs 12] [--lr 0.02] [--batch-size 32] [--seed 0] [--quick] [--out PATH]
                           [--cifar10 DIR [--limit N]]
"""
NAME = "cnn"
YEAR = 1998
TITLE = "A small CNN beats the MLP on the digits with fewer parameters"
NEEDS = ["01", "02", "03", "04", "05", "06", "09"]
TARGET = "higher test accuracy than the MLP on the same digits split, with fewer parameters, in under 60 s"
# what the harness checks (TARGET says it in words for people)
GOAL = {"beat": [("test accuracy", "higher", "the 1986 MLP"), ("parameter count", "lower", "the 1986 MLP")],
        "max_seconds": 60}

import sys
import time
from pathlib import Path

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--lr", type=float, default=0.02, help="SGD learning rate, momentum 0.9 (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=128,
                        help="units in each hidden layer of the 1986 MLP (default %(default)s, as in that milestone)")
    parser.add_argument("--cifar10", type=Path, default=None, metavar="DIR",
                        help="train on CIFAR-10 from DIR (holding cifar-10-batches-py/) instead of the digits")
    parser.add_argument("--limit", type=int, default=None, help="with --cifar10: use only the first N training images")


def build_models(channels, side, seed, hidden=128):
    """(mlp, cnn) for images of `channels` x `side` x `side` and 10 classes; the MLP is the 1986 milestone's."""
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.spatial import BatchNorm2d, Conv2d, Flatten, MaxPool2d

    mlp = Sequential(Flatten(), Linear(channels * side * side, hidden, rng=seed), ReLU(),
                     Linear(hidden, hidden, rng=seed + 5), ReLU(), Linear(hidden, 10, rng=seed + 1))
    cnn = Sequential(
        Conv2d(channels, 16, 3, padding=1, rng=seed + 2), BatchNorm2d(16), ReLU(), MaxPool2d(2),
        Conv2d(16, 16, 3, padding=1, rng=seed + 3), BatchNorm2d(16), ReLU(), MaxPool2d(2),
        Flatten(), Linear(16 * (side // 4) ** 2, 10, rng=seed + 4),
    )
    return mlp, cnn


def train(name, model, train_set, test_set, args, log):
    """SGD with momentum 0.9; returns per-epoch (mean training loss, test accuracy) and seconds."""
    import numpy as np

    from tinytorch.core.autograd import no_grad
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.data.loader import DataLoader

    @no_grad()
    def accuracy():
        model.eval()
        correct = 0
        for x, y in DataLoader(test_set, batch_size=500):
            correct += int((model(x).data.argmax(axis=1) == y.data).sum())
        model.train()
        return correct / len(test_set)

    loss_fn = CrossEntropyLoss()
    params = model.parameters()
    velocity = [np.zeros_like(p.data) for p in params]
    history, start = [], time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        losses = []
        for x, y in DataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed * 1000 + epoch):
            loss = loss_fn(model(x), y)
            model.zero_grad()
            loss.backward()
            with no_grad():
                for v, p in zip(velocity, params):  # v = 0.9 v + grad; p -= lr v
                    v *= 0.9
                    v += p.grad.data
                    p.data -= args.lr * v
            losses.append(loss.item())
        history.append((float(np.mean(losses)), accuracy()))
        log(f"{name:>4} epoch {epoch:3d}/{args.epochs}  loss {history[-1][0]:.4f}  test accuracy {history[-1][1]:6.2%}  "
            f"({time.perf_counter() - start:5.1f} s)")
    return history, time.perf_counter() - start


def main(argv=None) -> int:
    run = harness.start(__file__, epochs=12, quick_epochs=2, options=options, argv=argv)
    args = run.args
    if args.limit is not None and (args.cifar10 is None or args.limit < 1):
        print("error: --limit N (N >= 1) only applies with --cifar10", file=sys.stderr)
        return 2

    from tinytorch.data.loader import TensorDataset, load_cifar10, load_digits

    if args.cifar10 is None:
        data = "the bundled 8x8 digits"
        train_set, test_set = load_digits("train", flatten=False), load_digits("test", flatten=False)
    else:
        data = f"CIFAR-10 from {args.cifar10}"
        try:
            train_set, test_set = load_cifar10(args.cifar10, "train"), load_cifar10(args.cifar10, "test")
        except (OSError, ValueError) as e:  # missing or damaged files: the loader's message says what to do
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.limit is not None:
            x, y = train_set.tensors
            train_set = TensorDataset(x.data[:args.limit], y.data[:args.limit])
    channels, side = train_set.tensors[0].shape[1], train_set.tensors[0].shape[2]
    mlp, cnn = build_models(channels, side, args.seed, args.hidden)

    print(f"data: {data}: {len(train_set)} training and {len(test_set)} test images of {channels}x{side}x{side}; "
          f"SGD lr {args.lr}, momentum 0.9, batch {args.batch_size}, {args.epochs} epoch(s) per model"
          + ("" if args.cifar10 is None else " (the time limit applies to the digits only)"))
    print(f"MLP: {mlp.num_parameters():,} parameters; CNN: {cnn.num_parameters():,} parameters")
    watch = harness.Stopwatch()
    mlp_hist, mlp_s = train("MLP", mlp, train_set, test_set, args, lambda s: print(s, flush=True))
    cnn_hist, cnn_s = train("CNN", cnn, train_set, test_set, args, lambda s: print(s, flush=True))
    seconds = watch.stop()

    mlp_acc, cnn_acc = mlp_hist[-1][1], cnn_hist[-1][1]
    print(f"MLP: test accuracy {mlp_acc:.2%} with {mlp.num_parameters():,} parameters ({mlp_s:.1f} s)")
    print(f"CNN: test accuracy {cnn_acc:.2%} with {cnn.num_parameters():,} parameters ({cnn_s:.1f} s)")
    run.save_plot(plot(run.pyplot(), mlp_hist, cnn_hist, cnn, mlp.num_parameters(), cnn.num_parameters(), data))
    return run.report(beats=[("test accuracy", cnn_acc, "the 1986 MLP", mlp_acc, "higher"),
                             ("parameter count", cnn.num_parameters(), "the 1986 MLP", mlp.num_parameters(), "lower")],
                      seconds=seconds if args.cifar10 is None else None,
                      profile=lambda: training_step(cnn, train_set, args.batch_size))


def training_step(model, train_set, batch_size: int) -> None:
    "One forward and backward pass of `model` on the first batch (what the harness profiles when time runs out)."
    from tinytorch.core.losses import CrossEntropyLoss

    x, y = train_set.tensors
    loss = CrossEntropyLoss()(model(x[:batch_size]), y[:batch_size])
    model.zero_grad()
    loss.backward()


def plot(plt, mlp_hist, cnn_hist, cnn, mlp_params, cnn_params, data):
    """Left: training loss and test accuracy per epoch of both models. Right: the CNN's first-layer filters."""
    import numpy as np

    fig = plt.figure(figsize=(12, 4.4))
    grid = fig.add_gridspec(2, 6, width_ratios=[3, 3, 1, 1, 1, 1])
    ax_loss, ax_acc = fig.add_subplot(grid[:, 0]), fig.add_subplot(grid[:, 1])
    for hist, label in ((mlp_hist, f"MLP ({mlp_params:,} params)"), (cnn_hist, f"CNN ({cnn_params:,} params)")):
        epochs = np.arange(1, len(hist) + 1)
        ax_loss.plot(epochs, [h[0] for h in hist], marker="o", markersize=3, label=label)
        ax_acc.plot(epochs, [h[1] for h in hist], marker="o", markersize=3, label=label)
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("mean training loss")
    ax_loss.set_yscale("log")
    ax_loss.legend(fontsize=8)
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy")
    ax_acc.legend(fontsize=8)
    ax_acc.set_title(f"final: MLP {mlp_hist[-1][1]:.1%}, CNN {cnn_hist[-1][1]:.1%}", fontsize=10)
    filters = cnn.layers[0].weight.data  # (16, C, 3, 3)
    for k in range(8):
        ax = fig.add_subplot(grid[k // 4, 2 + k % 4])
        f = filters[k].mean(axis=0) if filters.shape[1] > 1 else filters[k, 0]
        lim = float(np.abs(f).max()) or 1.0
        ax.imshow(f, cmap="RdBu", vmin=-lim, vmax=lim)
        ax.set_title(f"filter {k}", fontsize=8)
        ax.axis("off")
    fig.suptitle(f"{YEAR} {NAME}: {TITLE} ({data})", fontsize=10)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())

"""1986: a multi-layer perceptron trained by backpropagation reads handwritten digits, with your tinytorch.

In 1986 David Rumelhart, Geoffrey Hinton and Ronald Williams published "Learning representations
by back-propagating errors" in Nature. The chain rule had been used for gradients before (Linnainmaa
1970, Werbos 1974), but their paper showed that hidden layers trained this way learn useful
internal features on their own, and it ended the long winter that followed Minsky and Papert's
1969 book. Within a few years the same recipe (a few fully connected layers, a nonlinearity, and
stochastic gradient descent) was reading handwritten ZIP codes for the US Postal Service.

This script trains such a network on the handwritten digits bundled with tinytorch (8x8 images,
1,437 for training, a fixed split of 360 for testing) with your whole stack: Tensor and autograd
(modules 01, 06), Linear and ReLU (02, 03), cross-entropy (04), a shuffled DataLoader (05), SGD
with momentum (07) and the Trainer with a cosine learning-rate schedule (08). The plot shows the
loss and accuracy curves and the confusion matrix of the test set.

    tito milestone run mlp [--epochs 15] [--hidden 128] [--lr 0.05] [--batch-size 32] [--seed 0] [--quick] [--out PATH]
"""
NAME = "mlp"
YEAR = 1986
TITLE = "Backpropagation trains a multi-layer perceptron on handwritten digits"
NEEDS = ["01", "02", "03", "04", "05", "06", "07", "08"]
TARGET = "at least 95% test accuracy on the bundled digits' fixed 360-image test split"
# what the harness checks (TARGET says it in words for people)
GOAL = {"reach": [("test accuracy", ">=", 0.95)]}

import sys

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--hidden", type=int, default=128, help="units in each of the two hidden layers (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.05, help="initial SGD learning rate (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="examples per step (default %(default)s)")


def main(argv=None) -> int:
    run = harness.start(__file__, epochs=15, quick_epochs=3, options=options, argv=argv)
    args = run.args
    watch = harness.Stopwatch()

    import numpy as np

    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.optimizers import SGD
    from tinytorch.core.training import CosineAnnealingLR, EpochProgress, Trainer, evaluate
    from tinytorch.data.loader import DataLoader, TensorDataset, load_digits

    train, test = load_digits("train"), load_digits("test")
    pixels = train.tensors[0].data
    mean, std = pixels.mean(axis=0), pixels.std(axis=0) + 1.0  # training statistics only; +1: blank pixels

    def standardized(ds):
        return TensorDataset(((ds.tensors[0].data - mean) / std).astype(np.float32), ds.tensors[1].data)

    train_loader = DataLoader(standardized(train), batch_size=args.batch_size, shuffle=True, seed=args.seed)
    test_loader = DataLoader(standardized(test), batch_size=360)
    rng = np.random.default_rng(args.seed)
    model = Sequential(Linear(64, args.hidden, rng=rng), ReLU(), Linear(args.hidden, args.hidden, rng=rng), ReLU(),
                       Linear(args.hidden, 10, rng=rng))
    opt = SGD(model.parameters(), lr=args.lr, momentum=0.9)
    trainer = Trainer(model, CrossEntropyLoss(), opt, scheduler=CosineAnnealingLR(opt, T_max=args.epochs),
                      progress=False)
    print(f"data: {len(train)} training and {len(test)} test digits (8x8), standardized; model 64-{args.hidden}-"
          f"{args.hidden}-10 with ReLU, {model.num_parameters():,} parameters; SGD lr {args.lr} momentum 0.9, "
          f"cosine schedule, batch {args.batch_size}, {args.epochs} epochs (seed {args.seed})")
    with run.progress() as progress:
        history = trainer.fit(train_loader, args.epochs, val_loader=test_loader,
                              callback=lambda r: progress.update(r["epoch"], EpochProgress.describe(r)))
    final = evaluate(model, test_loader, CrossEntropyLoss())
    seconds = watch.stop()
    print(f"trained {args.epochs} epochs in {seconds:.1f} s (data loading and evaluation included); "
          f"test accuracy {final['accuracy']:.1%}, test loss {final['loss']:.4f}")

    confusion = confusion_matrix(model, test_loader)
    worst = max(((i, j) for i in range(10) for j in range(10) if i != j), key=lambda ij: confusion[ij])
    if confusion[worst]:
        print(f"most frequent mistake: {confusion[worst]} test image(s) of a {worst[0]} read as {worst[1]}")
    run.save_plot(plot(run.pyplot(), history, confusion))
    return run.report(("test accuracy", final["accuracy"]))


def confusion_matrix(model, loader):
    "counts[true, predicted] over the loader, computed in eval mode without a graph."
    import numpy as np

    from tinytorch.core.autograd import no_grad

    counts = np.zeros((10, 10), dtype=np.int64)
    model.eval()
    with no_grad():
        for x, y in loader:
            np.add.at(counts, (y.data, model(x).data.argmax(axis=1)), 1)
    model.train()
    return counts


def plot(plt, history, confusion):
    "Left: train/test loss; middle: train/test accuracy; right: the test confusion matrix."
    import numpy as np

    epochs = [r["epoch"] for r in history]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.4), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    ax1.plot(epochs, [r["train_loss"] for r in history], "o-", label="train")
    ax1.plot(epochs, [r["val_loss"] for r in history], "s-", label="test")
    ax1.set_yscale("log")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.set_title("loss")
    ax1.legend()
    ax2.plot(epochs, [r["train_accuracy"] for r in history], "o-", label="train")
    ax2.plot(epochs, [r["val_accuracy"] for r in history], "s-", label="test")
    ax2.axhline(0.95, color="gray", linestyle=":", label="target 95%")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy")
    ax2.set_title(f"accuracy: test {history[-1]['val_accuracy']:.1%} after epoch {epochs[-1]}")
    ax2.legend(loc="lower right")
    im = ax3.imshow(confusion, cmap="Blues")
    for i in range(10):
        for j in range(10):
            if confusion[i, j]:
                ax3.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=8,
                         color="white" if confusion[i, j] > confusion.max() / 2 else "black")
    ax3.set_xticks(range(10))
    ax3.set_yticks(range(10))
    ax3.set_xlabel("predicted digit")
    ax3.set_ylabel("true digit")
    ax3.set_title(f"test confusion matrix ({int(np.trace(confusion))}/{int(confusion.sum())} right)")
    fig.colorbar(im, ax=ax3, shrink=0.8)
    fig.suptitle(f"{YEAR} {NAME}: {TITLE}")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())

"""2017: a transformer language model, rebuilt with your own tinytorch, learns to write stories.

In 2017 Ashish Vaswani and seven colleagues at Google published "Attention Is All You Need": a
sequence model with no recurrence at all, only attention, position encodings, feed-forward layers,
residual connections and layer normalisation. Every token looks at every earlier token in one
parallel step, so the whole sequence trains at once. OpenAI's GPT (2018) kept just its decoder, and
GPT-2 (2019) showed how far that one block, stacked and scaled, could go.

This script trains a small GPT, character by character, on the story corpus bundled with tinytorch,
with your whole stack: Tensor and autograd (01, 06), GELU and softmax (02), Linear and Dropout (03),
cross-entropy (04), the corpus loader (05), Adam (07), embeddings and positions (11), causal
multi-head attention (12) and the transformer blocks (13). Its yardstick is the simplest language
model there is, a bigram table (how often each character follows each other one), measured in this
script on the same split. The GPT must predict the held-out last tenth of the corpus better than the
best smoothed bigram table (its smoothing tuned on that very validation text, the strongest bigram
this data allows), within five minutes on two cores; then it writes a story from a prompt.

    tito milestone run transformer [--epochs 30] [--seed 0] [--quick] [--out PATH]
        [--embed-dim 96] [--layers 2] [--heads 4] [--context 64] [--batch-size 32] [--lr 3e-3]
        [--prompt "Once upon a time"] [--length 300]
"""
NAME = "transformer"
YEAR = 2017
TITLE = "A small GPT learns the bundled stories and writes more of them"
NEEDS = ["01", "02", "03", "04", "05", "06", "07", "11", "12", "13"]
TARGET = "validation loss below a bigram model's on the same split, within 5 minutes"
# what the harness checks (TARGET says it in words for people)
GOAL = {"beat": [("validation loss", "lower", "a bigram model")], "max_seconds": 300}

import time

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--embed-dim", type=int, default=96, help="width of the model (default %(default)s)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default %(default)s)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads per block (default %(default)s)")
    parser.add_argument("--context", type=int, default=64, help="characters the model sees at once (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per step (default %(default)s)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default %(default)s)")
    parser.add_argument("--prompt", default="Once upon a time", help="how the generated story starts")
    parser.add_argument("--length", type=int, default=300, help="characters to generate (default %(default)s)")


def bigram_validation_loss(train_ids, val_ids, vocab):
    """Cross-entropy (nats per character) of add-alpha smoothed bigram counts of the training text on
    the validation text, for the alpha that suits the validation text best; returns (loss, alpha)."""
    import numpy as np

    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (train_ids[:-1], train_ids[1:]), 1.0)
    best = None
    for alpha in (0.01, 0.03, 0.1, 0.3, 1.0):
        probs = (counts + alpha) / (counts + alpha).sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[val_ids[:-1], val_ids[1:]]).mean())
        best = min(best or (loss, alpha), (loss, alpha))
    return best


def main(argv=None) -> int:
    run = harness.start(__file__, epochs=30, quick_epochs=1, options=options, argv=argv)
    args = run.args
    start, watch = time.perf_counter(), harness.Stopwatch()

    import numpy as np

    from tinytorch.core.autograd import no_grad
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.optimizers import Adam
    from tinytorch.data.loader import load_text_corpus
    from tinytorch.models.gpt import GPT

    text = load_text_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    split = int(len(ids) * 0.9)
    train_ids, val_ids = ids[:split], ids[split:]
    V, T, B = len(chars), args.context, args.batch_size
    bigram, alpha = bigram_validation_loss(train_ids, val_ids, V)
    print(f"data: the bundled corpus, {len(text):,} characters, {V} distinct; train {len(train_ids):,}, "
          f"validation {len(val_ids):,} (the last tenth)")
    print(f"baseline: bigram counts with add-{alpha:g} smoothing: validation loss {bigram:.4f} nats per character "
          f"(uniform guessing: {np.log(V):.4f})")

    rng = np.random.default_rng(args.seed)
    model = GPT(V, T, args.embed_dim, args.heads, args.layers, rng=args.seed)
    opt = Adam(model.parameters(), lr=args.lr)
    loss_fn = CrossEntropyLoss()
    steps_per_epoch = max(1, len(train_ids) // (B * T))
    if run.quick:
        steps_per_epoch = min(steps_per_epoch, 5)
    val_starts = np.arange(0, len(val_ids) - T - 1, T)
    print(f"model: GPT with {args.layers} blocks of width {args.embed_dim}, {args.heads} heads, context {T}: "
          f"{model.num_parameters():,} parameters; Adam lr {args.lr}, batch {B}, {steps_per_epoch} steps per "
          f"epoch (one pass over the training characters), {args.epochs} epoch(s), seed {args.seed}")

    def validation_loss():
        model.eval()
        losses = []
        with no_grad():
            for i in range(0, len(val_starts), 64):
                s = val_starts[i:i + 64]
                x = np.stack([val_ids[j:j + T] for j in s])
                y = np.stack([val_ids[j + 1:j + T + 1] for j in s])
                losses.append(loss_fn(model(x).reshape(-1, V), y.reshape(-1)).item() * len(s))
        model.train()
        return sum(losses) / len(val_starts)

    history = []
    with run.progress() as progress:
        for epoch in range(1, args.epochs + 1):
            train_losses = []
            for _ in range(steps_per_epoch):
                s = rng.integers(0, len(train_ids) - T - 1, B)
                x = np.stack([train_ids[j:j + T] for j in s])
                y = np.stack([train_ids[j + 1:j + T + 1] for j in s])
                loss = loss_fn(model(x).reshape(-1, V), y.reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                train_losses.append(loss.item())
            history.append((float(np.mean(train_losses)), validation_loss()))
            progress.update(epoch, f"train {history[-1][0]:.3f}  validation {history[-1][1]:.3f}  "
                                   f"bigram {bigram:.3f}  ({time.perf_counter() - start:.0f} s)")
    seconds = watch.stop()
    val = history[-1][1]
    print(f"trained {args.epochs} epoch(s) in {seconds:.1f} s: validation loss {val:.4f} vs the bigram's {bigram:.4f}")

    prompt = "".join(c for c in args.prompt if c in stoi) or chars[0]
    out = model.generate(np.array([[stoi[c] for c in prompt]]), args.length, temperature=0.8, top_k=10, seed=args.seed)
    print(f"generated (temperature 0.8, top-k 10, seed {args.seed}):\n---\n{''.join(chars[i] for i in out[0])}\n---")

    run.save_plot(plot(run.pyplot(), history, bigram, run.title))
    return run.report(beats=[("validation loss", val, "a bigram model", bigram, "lower")], seconds=seconds,
                      profile=lambda: training_step(model, train_ids, T, B, args.seed))


def training_step(model, train_ids, context, batch_size, seed) -> None:
    """One forward and backward pass of `model` on one batch of training windows (what the harness profiles
    when the time limit is missed, to name the slowest ops)."""
    import numpy as np

    from tinytorch.core.losses import CrossEntropyLoss

    starts = np.random.default_rng(seed).integers(0, len(train_ids) - context - 1, batch_size)
    x = np.stack([train_ids[j:j + context] for j in starts])
    y = np.stack([train_ids[j + 1:j + context + 1] for j in starts])
    loss = CrossEntropyLoss()(model(x).reshape(-1, model.vocab_size), y.reshape(-1))
    model.zero_grad()
    loss.backward()


def plot(plt, history, bigram, title):
    "Training and validation loss per epoch, with the bigram baseline."
    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = range(1, len(history) + 1)
    ax.plot(epochs, [h[0] for h in history], marker="o", label="GPT, training batches")
    ax.plot(epochs, [h[1] for h in history], marker="s", label="GPT, validation")
    ax.axhline(bigram, color="grey", linestyle="--", label="bigram model, validation")
    ax.set_xlabel("epoch (one pass over the training characters)")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())

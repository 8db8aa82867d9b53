"""BPE training on the bundled corpus: the naive trainer (recount every pair per merge) against the
incremental one (update only the words a merge changed). Both run in this process on the same words.

    python tests/benchmarks/bench_bpe.py [--merges 1000] [--repeats 3]

Prints, for each trainer, the best of `repeats` wall-clock times (seconds) to learn `merges` merges
(default 1000, the README's row), checks that both learned the same merges, and prints the ratio.
A second table gives the time at intermediate merge counts from one run of each (a callback
records the time after every merge). The garbage collector is paused while timing, as `timeit`
does (`--gc` leaves it running). A last row trains without the pre-split (`--no-split-merges`,
default 200 merges): the whole corpus is then one 39 KB word that every merge touches, the worst
case for the incremental trainer. Not a test: nothing here fails except a disagreement.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tinytorch.data.loader import load_text_corpus  # noqa: E402
from tinytorch.text.tokenizers import (  # noqa: E402
    BPETokenizer,
    train_merges_incremental,
    train_merges_naive,
)


def timed(trainer, words, freqs, merges, pause_gc=True):
    """(wall seconds, seconds after each merge, merges learned, CPU seconds) of one run.

    CPU time (`time.process_time`) counts only this process's work, so on a busy shared machine
    it stays close to what the wall clock shows on an idle one; both are printed.
    """
    marks = []
    if pause_gc:
        gc.disable()
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        learned = trainer(words, freqs, merges, callback=lambda k, pair, count: marks.append(time.perf_counter() - t0))
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.enable()
    return total, marks, learned, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merges", type=int, default=1000, help="merges to learn (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per trainer; the best time is reported")
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector running while timing")
    parser.add_argument("--no-split-merges", type=int, default=200,
                        help="merges for the run without pre-split (0 skips it; default 200)")
    args = parser.parse_args(argv)

    corpus = load_text_corpus()
    counts = BPETokenizer().word_counts(corpus)             # GPT-2 style pre-split, as BPETokenizer.train does
    words = [list(w.encode("utf-8")) for w in counts]
    freqs = list(counts.values())
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(f"corpus: {len(corpus.encode('utf-8')):,} bytes, {sum(freqs):,} words, {len(words):,} distinct "
          f"({sum(len(w) for w in words):,} bytes); Python {platform.python_version()} on {platform.machine()}"
          f", {os.cpu_count()} CPUs{load}")

    results = {}
    for name, trainer in (("naive", train_merges_naive), ("incremental", train_merges_incremental)):
        runs = [timed(trainer, words, freqs, args.merges, not args.gc) for _ in range(args.repeats)]
        results[name] = min(runs, key=lambda r: r[0])
    naive, inc = results["naive"], results["incremental"]
    if naive[2] != inc[2]:
        print("ERROR: the two trainers learned different merges")
        return 1
    n = len(inc[2])
    print(f"\n{n} merges (best of {args.repeats}, garbage collector {'running' if args.gc else 'paused'}):")
    print(f"  {'':12} {'wall':>9} {'CPU':>9}")
    print(f"  {'naive':12} {naive[0]:8.3f}s {naive[3]:8.3f}s")
    print(f"  {'incremental':12} {inc[0]:8.3f}s {inc[3]:8.3f}s")
    print(f"  {'ratio':12} {naive[0] / inc[0]:8.1f}x {naive[3] / inc[3]:8.1f}x   (same merges: True)")

    print("\nseconds after k merges (from the best run of each):")
    print(f"  {'k':>6} {'naive':>9} {'incremental':>12} {'ratio':>7}")
    for k in (10, 100, 250, 500, 750, 1000, 2000):
        if k <= n:
            a, b = naive[1][k - 1], inc[1][k - 1]
            print(f"  {k:>6} {a:>9.3f} {b:>12.3f} {a / b:>6.1f}x")

    if args.no_split_merges:
        whole = [list(corpus.encode("utf-8"))]
        naive1 = timed(train_merges_naive, whole, [1], args.no_split_merges, not args.gc)
        inc1 = timed(train_merges_incremental, whole, [1], args.no_split_merges, not args.gc)
        if naive1[2] != inc1[2]:
            print("ERROR: the two trainers learned different merges without pre-split")
            return 1
        print(f"\nno pre-split (one word of {len(whole[0]):,} bytes), {len(inc1[2])} merges, one run each:")
        print(f"  naive {naive1[0]:.3f} s wall ({naive1[3]:.3f} s CPU), incremental {inc1[0]:.3f} s wall "
              f"({inc1[3]:.3f} s CPU), ratio {naive1[0] / inc1[0]:.1f}x wall ({naive1[3] / inc1[3]:.1f}x CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The default FlowGaussianizer.fit against an independent plain-autograd Glow, in one process, alternating rounds.

The reference is ``ref_glow.py`` of the shared benchmarks (``fit_throughput(X, seed)``: vectors per
second of one epoch at batch 64 of BERT-flow's official Glow, trained with autograd and AdamW); it is
imported from ``--reference``, never copied. skflow's figure is the whole default ``fit`` (validation,
standardisation, initialisation, the epoch) on the same 20,000 x 384 float32 array. Each round runs both,
in alternating order, after a warm-up; the ratio is the median of skflow's rounds over the median of the
reference's, and every round's ratio is printed.

skflow's training steps on batches this small run on one torch thread (``SINGLE_THREAD_MAX_ELEMENTS``);
the reference runs on ``--threads``. Like for like, the reference is also run on one thread and both
ratios are reported. ``--busy N`` runs N processes that spin on a core during the measurement (a machine
shared with other work: a second fit, a browser, Ray workers).

    python benchmarks/flow_vs_reference.py --reference ../shared/benchmarks/ref_glow.py [--rounds 7] [--threads 2]
                                           [--busy 0]
"""

import argparse
import contextlib
import importlib.util
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from skflow import FlowGaussianizer


def load_reference(path: str):
    spec = importlib.util.spec_from_file_location("ref_glow", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_data() -> np.ndarray:
    rng = np.random.RandomState(0)
    return (rng.standard_t(4, size=(20000, 384)) @ rng.randn(384, 384) * 0.1).astype(np.float32)


def skflow_throughput(X: np.ndarray, seed: int) -> float:
    start = time.perf_counter()
    FlowGaussianizer(random_state=seed, device="cpu").fit(X)
    return len(X) / (time.perf_counter() - start)


def reference_throughput(reference, X: np.ndarray, seed: int, threads: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return reference.fit_throughput(X, seed)
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def busy_cores(n: int):
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="path of ref_glow.py")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the process")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    args = parser.parse_args()
    with busy_cores(args.busy):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    reference, X = load_reference(args.reference), reference_data()
    skflow_throughput(X[:4000], 0)  # warm-up of both
    reference_throughput(reference, X[:4000], 0, args.threads)
    runs = {"skflow": [], f"reference, {args.threads} threads": [], "reference, 1 thread": []}
    for round_ in range(args.rounds):
        sides = [
            ("skflow", lambda: skflow_throughput(X, round_)),
            (f"reference, {args.threads} threads", lambda: reference_throughput(reference, X, round_, args.threads)),
            ("reference, 1 thread", lambda: reference_throughput(reference, X, round_, 1)),
        ]
        for name, measure in sides if round_ % 2 == 0 else sides[::-1]:
            runs[name].append(measure())
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:,.0f}" for name, values in runs.items()))
    ours = statistics.median(runs["skflow"])
    print(f"\ntorch {torch.__version__}, {args.threads} threads, {args.busy} busy cores, {args.rounds} rounds:")
    print("| side | vectors / s (median) | skflow's ratio (of medians) | ratio per round |")
    print("|---|---|---|---|")
    print(f"| skflow | {ours:,.0f} | | |")
    for name, values in list(runs.items())[1:]:
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(runs["skflow"], values))
        print(f"| {name} | {statistics.median(values):,.0f} | {ours / statistics.median(values):.2f}x | {per_round} |")


if __name__ == "__main__":
    main()

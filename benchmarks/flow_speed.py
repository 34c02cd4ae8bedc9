"""Fit and transform speed of FlowGaussianizer against the same Glow built with normflows.

Both flows have the same structure: 3 levels x 3 steps of ActNorm, a fixed
permutation and an additive coupling whose network has two hidden layers of
width 32 and a zero-initialised output layer, half the features factored out
per level, standard normal prior. The normflows coupling network is the
library's own ``nf.nets.MLP`` (hidden biases where skflow has the official
hidden ActNorms), as a normflows user would write it. Both train with batch 64, lr 1e-3, weight decay 0.01 and
gradient clipping at 1 on the same float32 data; the normflows model with the
loop and optimiser (``torch.optim.AdamW``) a user would write.

Each measurement runs in its own process, so peak memory (max RSS above the
process's baseline after loading the data) is per method.

``--coupling affine`` and ``--permutation lu`` / ``random`` change both sides
alike: normflows' ``AffineCouplingBlock(scale=True)`` (its exp scale map;
skflow bounds the log-scale with tanh), ``LULinearPermute`` and
``Permute(mode="shuffle")``; the default fixed permutation is normflows'
``Permute(mode="swap")``.

    python benchmarks/flow_speed.py [--n-train 20000] [--dim 384] [--epochs 1] [--threads 0] [--repeats 1]
                                    [--coupling additive|affine] [--permutation reverse|random|lu]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from _memory import PeakMemory

from skflow.synthetic import make_anisotropic_mixture


def _write_data(args, path: str) -> None:
    X = make_anisotropic_mixture(args.n_train + args.n_test, args.dim, df=6.0, random_state=0)
    np.save(path, X.astype(np.float32))


def run_skflow(args, X, X_test):
    from skflow import FlowGaussianizer

    flow = FlowGaussianizer(
        max_epochs=args.epochs, coupling=args.coupling, permutation=args.permutation, device="cpu", random_state=0
    )
    flow.fit(X[:640])  # warm-up: first-call costs of torch and MKL
    start = time.perf_counter()
    flow.fit(X)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    flow.transform(X)
    transform_s = time.perf_counter() - start
    return fit_s, transform_s, flow.score(X_test)


def build_normflows_glow(d: int, n_levels: int, depth: int, hidden: int, coupling="additive", permutation="reverse"):
    import normflows as nf

    from skflow.flows import level_sizes

    class ActNorm(nf.flows.ActNorm):
        """normflows' ActNorm returns a 0-d log-det that MultiscaleFlow cannot accumulate: expand it."""

        def forward(self, z):
            z, log_det = super().forward(z)
            return z, log_det.expand(len(z))

        def inverse(self, z):
            z, log_det = super().inverse(z)
            return z, log_det.expand(len(z))

    sizes = level_sizes(d, n_levels)
    flows = []
    # normflows lists levels from the top (fewest features) down and evaluates log_prob by
    # running each level's list backwards with .inverse: generative order [coupling,
    # permute, actnorm] gives skflow's data-side order actnorm -> permute -> coupling.
    for size in reversed(sizes):
        level = []
        for _ in range(depth):
            n_out = (size - size // 2) * (2 if coupling == "affine" else 1)
            net = nf.nets.MLP([size // 2, hidden, hidden, n_out], init_zeros=True)
            if permutation == "lu":
                mixing = nf.flows.LULinearPermute(size)
            else:
                mixing = nf.flows.Permute(size, mode="shuffle" if permutation == "random" else "swap")
            level += [
                nf.flows.AffineCouplingBlock(net, scale=coupling == "affine"),
                mixing,
                ActNorm((size,)),
            ]
        flows.append(level)
    q0 = [nf.distributions.DiagGaussian(sizes[-1], trainable=False)]
    q0 += [
        nf.distributions.DiagGaussian(sizes[j] - sizes[j + 1], trainable=False) for j in reversed(range(len(sizes) - 1))
    ]
    merges = [nf.flows.Merge() for _ in range(len(sizes) - 1)]
    return nf.MultiscaleFlow(q0, flows, merges, class_cond=False)


def run_normflows(args, X, X_test):
    _train_normflows(args, X[:640], 1)  # warm-up: first-call costs of torch and MKL
    start = time.perf_counter()
    model = _train_normflows(args, X, args.epochs)
    fit_s = time.perf_counter() - start
    model.eval()
    data = torch.from_numpy(X)
    start = time.perf_counter()
    with torch.no_grad():
        for part in torch.split(data, 8192):
            model.inverse_and_log_det(part)
    transform_s = time.perf_counter() - start
    with torch.no_grad():
        held_out = float(model.log_prob(torch.from_numpy(X_test), None).double().mean())
    return fit_s, transform_s, held_out


def _train_normflows(args, X, epochs):
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = build_normflows_glow(X.shape[1], 3, 3, 32, args.coupling, args.permutation)
    data = torch.from_numpy(X)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batch = 64
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        for step in range(len(data) // batch):
            loss = -model.log_prob(data[order[step * batch : (step + 1) * batch]], None).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    return model


def _child(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    data = np.load(args.data)
    X, X_test = data[: args.n_train], data[args.n_train :]
    with PeakMemory() as memory:
        fit_s, transform_s, held_out = {"skflow": run_skflow, "normflows": run_normflows}[args.child](args, X, X_test)
    print(json.dumps({
        "fit_vectors_per_s": len(X) * args.epochs / fit_s,
        "transform_vectors_per_s": len(X) / transform_s,
        "held_out_loglik": held_out,
        "peak_rss_mb": memory.mb,
        "fit_s": fit_s,
    }))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=20000)
    parser.add_argument("--n-test", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per library; medians are reported")
    parser.add_argument("--coupling", choices=["additive", "affine"], default="additive")
    parser.add_argument("--permutation", choices=["reverse", "random", "lu"], default="reverse")
    parser.add_argument("--child", choices=["skflow", "normflows"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    runs = {"skflow": [], "normflows": []}
    with tempfile.TemporaryDirectory() as tmp:
        args.data = os.path.join(tmp, "data.npy")
        _write_data(args, args.data)
        for _ in range(args.repeats):  # alternate, so slow phases of the machine hit both
            for name in runs:
                cmd = [sys.executable, __file__, "--child", name] + [
                    f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "child"
                ]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[name].append(json.loads(out.splitlines()[-1]))
    s = {k: float(np.median([r[k] for r in runs["skflow"]])) for k in runs["skflow"][0]}
    p = {k: float(np.median([r[k] for r in runs["normflows"]])) for k in runs["normflows"][0]}
    fit_ratios = [a["fit_vectors_per_s"] / b["fit_vectors_per_s"] for a, b in zip(runs["skflow"], runs["normflows"])]
    print(f"{args.coupling} coupling, {args.permutation} permutation; "
          f"{args.n_train} x {args.dim} float32, {args.epochs} epoch(s), batch 64, torch {torch.__version__}, "
          f"{torch.get_num_threads() if not args.threads else args.threads} threads; "
          f"median of {args.repeats} run(s) per library\n")
    print("| | skflow | normflows | ratio |")
    print("|---|---|---|---|")
    print(f"| fit throughput (vectors x epochs / s) | {s['fit_vectors_per_s']:,.0f} | {p['fit_vectors_per_s']:,.0f} | "
          f"{s['fit_vectors_per_s'] / p['fit_vectors_per_s']:.2f}x |")
    print(f"| transform throughput (vectors / s) | {s['transform_vectors_per_s']:,.0f} | "
          f"{p['transform_vectors_per_s']:,.0f} | {s['transform_vectors_per_s'] / p['transform_vectors_per_s']:.2f}x |")
    print(f"| held-out log-likelihood (nats / vector) | {s['held_out_loglik']:.2f} | {p['held_out_loglik']:.2f} | "
          f"{s['held_out_loglik'] - p['held_out_loglik']:+.2f} |")
    print(f"| peak memory during fit + transform (MB above start) | {s['peak_rss_mb']:.0f} | {p['peak_rss_mb']:.0f} | "
          f"{s['peak_rss_mb'] / max(p['peak_rss_mb'], 1e-9):.2f}x |")
    if args.repeats > 1:
        print(f"\nfit ratio per run (run i of skflow / run i of normflows): "
              f"{', '.join(f'{r:.2f}x' for r in fit_ratios)}")
        per_run = ", ".join(f"{r['fit_vectors_per_s']:,.0f}" for r in runs["skflow"])
        print(f"skflow fit throughput per run: {per_run}")

if __name__ == "__main__":
    main()

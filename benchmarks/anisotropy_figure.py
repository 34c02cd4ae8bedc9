"""Figure: the anisotropy of sentence embeddings, and what the flow does to it.

Embeds every unique STS-B sentence with the default encoder, fits
``FlowGaussianizer()`` (official defaults) on them, and plots, for each pooling:
left, the cosine similarity of random sentence pairs before and after the
flow; right, the eigenvalue spectrum of the covariance before and after
(eigenvalues divided by their sum, largest first, log scale). The numbers go to
the same path with ``.md``.

    python benchmarks/anisotropy_figure.py [--output docs/figures/anisotropy.png] [--cache-dir DIR]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from skflow import BertEmbedder, FlowGaussianizer
from skflow.datasets import load_sts
from skflow.metrics import paired_cosine


def spectrum(X: np.ndarray) -> np.ndarray:
    eigenvalues = np.linalg.eigvalsh(np.cov(X, rowvar=False))[::-1]
    return eigenvalues / eigenvalues.sum()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="docs/figures/anisotropy.png")
    parser.add_argument("--cache-dir")
    parser.add_argument("--data-home")
    parser.add_argument("--poolings", nargs="+", default=["cls", "first_last_avg"])
    parser.add_argument("--n-pairs", type=int, default=5000)
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stsb = load_sts("stsb", data_home=args.data_home)
    sentences = np.array(list(dict.fromkeys(stsb.pairs.ravel().tolist())), dtype=object)
    rng = np.random.RandomState(0)
    i, j = rng.randint(len(sentences), size=(2, args.n_pairs))
    keep = i != j
    i, j = i[keep], j[keep]

    fig, axes = plt.subplots(len(args.poolings), 2, figsize=(11, 3.6 * len(args.poolings)), squeeze=False)
    command = "python benchmarks/anisotropy_figure.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        f"Written by `{command.strip()}` with `{Path(args.output).name}`: {len(sentences):,} unique STS-B "
        f"sentences, {keep.sum():,} random pairs of them, all-MiniLM-L6-v2, `FlowGaussianizer(random_state=0)`.",
        "",
        "| pooling | cosine of random pairs, raw | after the flow | top eigenvalue's share of the variance, raw "
        "| after the flow | isotropic |",
        "|---|---|---|---|---|---|",
    ]
    for row, pooling in zip(axes, args.poolings):
        X = BertEmbedder(pooling=pooling, cache_dir=args.cache_dir).transform(sentences).astype(np.float64)
        Z = FlowGaussianizer(random_state=0).fit(X).transform(X)
        cos_x, cos_z = paired_cosine(X[i], X[j]), paired_cosine(Z[i], Z[j])
        spec_x, spec_z = spectrum(X), spectrum(Z)
        lines.append(f"| {pooling} | {cos_x.mean():.3f} ± {cos_x.std():.3f} | {cos_z.mean():.3f} ± {cos_z.std():.3f} "
                     f"| {spec_x[0]:.3f} | {spec_z[0]:.3f} | {1 / len(spec_x):.4f} |")

        bins = np.linspace(-0.4, 1.0, 71)
        row[0].hist(cos_x, bins=bins, alpha=0.6, label=f"raw (mean {cos_x.mean():.2f})")
        row[0].hist(cos_z, bins=bins, alpha=0.6, label=f"flow (mean {cos_z.mean():.2f})")
        row[0].set_xlabel("cosine similarity of random sentence pairs")
        row[0].set_ylabel("pairs")
        row[0].set_title(f"{pooling} pooling: random pairs")
        row[0].legend()
        ranks = np.arange(1, len(spec_x) + 1)
        row[1].semilogy(ranks, spec_x, label="raw")
        row[1].semilogy(ranks, spec_z, label="flow")
        row[1].axhline(1 / len(spec_x), color="grey", ls=":", label="isotropic")
        floor = 1e-6  # CLS has a near-constant direction (eigenvalue ~1e-19): keep the axis readable
        row[1].set_ylim(bottom=max(min(spec_x.min(), spec_z.min()) * 0.5, floor))
        row[1].set_xlabel("eigenvalue rank")
        row[1].set_ylabel("share of total variance")
        row[1].set_title(f"{pooling} pooling: covariance spectrum")
        row[1].legend()
    fig.suptitle("all-MiniLM-L6-v2 on STS-B sentences, before and after FlowGaussianizer()")
    fig.tight_layout()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    summary = Path(args.output).with_suffix(".md")
    summary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"\nwrote {args.output} and {summary}")


if __name__ == "__main__":
    main()

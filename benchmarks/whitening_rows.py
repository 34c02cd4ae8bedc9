"""How many rows a whitening needs: STS-B test Spearman of Whitener maps fitted on N STS-B train sentences.

The first N of 3,200 random unique STS-B train sentences (seed 0) are embedded with the default encoder
(float32); each map is fitted on them and scored on the 1,379 STS-B test pairs; then each map is fitted on
100 test pairs' own 200 sentences (pairs 0-99, 100-199, 500-599) and scored on them. Needs ``$SKFLOW_DATA``.

    python benchmarks/whitening_rows.py [--pooling cls mean] [--rows 100 200 400 800 1600 3200]
"""

import argparse
import warnings

import numpy as np

from skflow import BertEmbedder, FewRowsWarning, Whitener
from skflow.datasets import load_sts
from skflow.metrics import sts_spearman

METHODS = {"whiten": {}, "whiten-256": {"n_components": 256}, "soft-whiten": {"power": 0.25},
           "abtt-1": {"power": 0, "n_remove": 1}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pooling", nargs="+", default=["cls", "mean"])
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 200, 400, 800, 1600, 3200])
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", FewRowsWarning)
    test, train = load_sts("stsb", split="test"), load_sts("stsb", split="train")
    sentences = np.unique(train.pairs.ravel())
    sentences = sentences[np.random.RandomState(0).permutation(len(sentences))[: max(args.rows)]]
    for pooling in args.pooling:
        embedder = BertEmbedder(pooling=pooling, dtype="float32", device="cpu", show_progress_bar=False)
        pairs, fitting = embedder.transform(test.pairs), embedder.transform(sentences)
        print(f"\n{pooling}: fitted on N train sentences, STS-B test Spearman x 100\n")
        print("| method | " + " | ".join(f"{n:,}" for n in args.rows) + " |")
        print("|---|" + "---|" * len(args.rows))
        for name, params in METHODS.items():
            rho = [100 * Whitener(**params).fit(fitting[:n]).score(pairs, test.scores) for n in args.rows]
            print(f"| {name} | " + " | ".join(f"{r:.2f}" for r in rho) + " |")
        print(f"\n{pooling}: 100 pairs fitted on their own 200 sentences (pairs 0-99, 100-199, 500-599)\n")
        for name, params in {"raw": None, **METHODS}.items():
            rho = []
            for start in (0, 100, 500):
                few, gold = pairs[start : start + 100], test.scores[start : start + 100]
                rho.append(100 * (sts_spearman(few, gold) if params is None else
                                  Whitener(**params).fit(few).score(few, gold)))
            print(f"- {name}: " + ", ".join(f"{r:.2f}" for r in rho))


if __name__ == "__main__":
    main()

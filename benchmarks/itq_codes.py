"""Binary codes of STS-B sentences: raw sign bits against a random rotation and centred ITQ (ITQRotation).

The 2,758 sentences of the STS-B test pairs are embedded with the bundled
encoder (all-MiniLM-L6-v2, mean pooling, float32); every map is fitted on
them without labels (the paper's target setting). Each pair is scored by the
negative Hamming distance of its two codes (one bit per dimension, ``x > 0``,
as sentence-transformers' ``quantize_embeddings(x, "binary")``), and the
Spearman correlation with the gold scores is reported, at K = 384 and K = 128
bits, with the quantization loss per row where there is a rotation
(``quantization_loss_``) and the float32 cosine's Spearman for reference.

    python benchmarks/itq_codes.py [--seeds 0 1 2] [--cache-dir /tmp/skflow-itq-cache]
"""

import argparse
import json
import time

import numpy as np

from skflow import BertEmbedder, ITQRotation, Whitener
from skflow.datasets import load_sts
from skflow.metrics import sts_spearman


def hamming_spearman(codes: np.ndarray, scores: np.ndarray) -> float:
    """STS Spearman of the negative Hamming distance between the sign bits of each pair."""
    bits = codes > 0
    return sts_spearman_of(-(bits[:, 0] != bits[:, 1]).sum(axis=1), scores)


def sts_spearman_of(similarity: np.ndarray, scores: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(similarity, scores).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    test = load_sts("stsb", split="test")
    embedder = BertEmbedder(pooling="mean", dtype="float32", device="cpu", show_progress_bar=False,
                            cache_dir=args.cache_dir)
    pairs, scores = embedder.transform(test.pairs), test.scores
    X = pairs.reshape(-1, pairs.shape[-1])
    rows = {"float32 cosine, raw": sts_spearman(pairs, scores)}
    for k in (384, 128):
        rows[f"K={k} raw sign (first K dims)"] = hamming_spearman(pairs[..., :k], scores)
        rows[f"K={k} centred PCA sign"] = hamming_spearman(
            Whitener(power=0, n_components=k).fit(X).transform(pairs), scores)
        for name, n_iter in (("random rotation", 0), ("centred ITQ", 50), ("centred ITQ 200", 200)):
            spearman, losses, seconds = [], [], []
            for seed in args.seeds:
                start = time.perf_counter()
                rotation = ITQRotation(n_components=k, n_iter=n_iter, random_state=seed).fit(X)
                seconds.append(time.perf_counter() - start)
                spearman.append(hamming_spearman(rotation.transform(pairs), scores))
                losses.append(rotation.quantization_loss_)
            rows[f"K={k} {name}"] = {"spearman_mean": float(np.mean(spearman)), "spearman_min": min(spearman),
                                     "spearman_max": max(spearman), "loss_mean": float(np.mean(losses)),
                                     "fit_seconds": float(np.mean(seconds))}
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

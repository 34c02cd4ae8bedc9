"""float8 (e4m3) codes beside float32 and int8: retrieval nDCG@10 on SciFact, Cranfield and CISI, STS-B Spearman,
and the round trip; one power-of-2 scale for all dimensions against one per dimension.

Each retrieval set is embedded with all-MiniLM-L6-v2 as MTEB runs it (mean pooling, 256 tokens, float32); every
quantizer is fitted on the corpus only and applied to queries and documents alike. Rows:

- ``float32``: cosine of the raw vectors;
- ``int8``: the cosine of the dequantized per-dimension int8 codes (``evaluate --precision int8``);
- ``float8``: ``search(query codes, document codes, codes="float8")``, the cosine of the numbers the codes stand for
  (``evaluate --precision float8``);
- ``float8, float query``: the float32 query against the documents' float8 codes;
- ``float8 per dimension``: the same e4m3 rounding after one power-of-2 scale per dimension (each dimension's
  largest absolute value within 448), decoded and scaled back: the alternative to one scale.

STS-B (test pairs, mean pooling, 128 tokens, each quantizer fitted on the 2,758 sentences): Spearman of the cosine
of the decoded pairs. The round trip: the largest relative error ``|decoded - x| / |x|`` of the corpus values at
least ``2**-6 * scale_`` (e4m3's normal range; the bound is ``2**-4``), and the mean cosine of each row with its
decoded row (``Quantizer.score``).

    python benchmarks/float8_codes.py --cache-dir DIR [--data-home DATA] [--sets scifact cranfield cisi]
"""

import argparse
import os
import sys
import warnings
from pathlib import Path

import numpy as np
from _study import Clock, environment

from skflow import BertEmbedder, Quantizer
from skflow.compression import search
from skflow.compression._float8 import E4M3_VALUES, e4m3_bits
from skflow.compression._quantizer import _float8_scale
from skflow.datasets import load_beir, load_sts
from skflow.evaluation import retrieval_report
from skflow.metrics import sts_spearman

SETS = ("scifact", "cranfield", "cisi")
ROWS = ("float32", "int8", "float8", "float8, float query", "float8 per dimension")


def per_dimension(corpus: np.ndarray):
    """Encode and decode with one power-of-2 scale per dimension, fitted on ``corpus``."""
    scales = np.array([_float8_scale(float(v)) for v in np.abs(corpus).max(axis=0)])
    return lambda X: (E4M3_VALUES[e4m3_bits(X / scales)] * scales).astype(np.float32)


def stored(queries: np.ndarray, documents: np.ndarray, k: int = 100) -> dict:
    """``{row: (scores, indices)}``, each quantizer fitted on the documents."""
    int8, fp8 = Quantizer(precision="int8").fit(documents), Quantizer(precision="float8").fit(documents)
    document_codes, by_dimension = fp8.transform(documents), per_dimension(documents)
    return {
        "float32": search(queries, documents, k),
        "int8": search(*(int8.inverse_transform(int8.transform(x)) for x in (queries, documents)), k),
        "float8": search(fp8.transform(queries), document_codes, k, codes="float8"),
        "float8, float query": search(queries, document_codes, k, codes="float8"),
        "float8 per dimension": search(by_dimension(queries), by_dimension(documents), k),
    }


def round_trip(X: np.ndarray) -> tuple[float, float]:
    """The largest relative error of the values in e4m3's normal range, and the mean cosine kept."""
    fp8 = Quantizer(precision="float8").fit(X)
    decoded = fp8.inverse_transform(fp8.transform(X)).astype(np.float64)
    normal = np.abs(X) >= 2.0**-6 * fp8.scale_
    return float((np.abs(decoded - X)[normal] / np.abs(X)[normal]).max()), fp8.score(X)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="embedding cache (each text embedded once)")
    parser.add_argument("--data-home", default=os.environ.get("SKFLOW_RETRIEVAL_DATA"),
                        help="the folder of the sets in BEIR's layout (default: $SKFLOW_RETRIEVAL_DATA)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    args = parser.parse_args(argv)
    clock = Clock()
    embedder = BertEmbedder(pooling="mean", max_length=256, dtype="float32", cache_dir=args.cache_dir,
                            show_progress_bar=False)
    lines = ["| corpus | " + " | ".join(ROWS) + " | round trip: max relative error, mean cosine |",
             "|---|" + "---:|" * len(ROWS) + "---|"]
    for name in args.sets:
        data = load_beir(name if name == "scifact" else Path(args.data_home) / name, data_home=args.data_home)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "BertEmbedder: .* longer than max_length")  # as MTEB truncates
            documents, queries = embedder.transform(data.corpus), embedder.transform(data.queries)
        ndcg = {row: 100 * retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)["ndcg@10"]
                for row, found in stored(queries, documents).items()}
        error, kept = round_trip(documents)
        cells = [f"{value:.2f} ({100 * value / ndcg['float32']:.1f}%)" for value in ndcg.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {error:.4f}, {kept:.6f} |")
        print(f"[{clock}] {name}: {ndcg}", file=sys.stderr, flush=True)
    test = load_sts("stsb", split="test", download_if_missing=False)
    sts = embedder.set_params(max_length=128).transform(test.pairs)
    sentences = sts.reshape(-1, sts.shape[-1])
    rho = {"float32": sts_spearman(sts, test.scores)}
    for row, codes in (("int8", Quantizer(precision="int8")), ("float8", Quantizer(precision="float8"))):
        codes.fit(sentences)
        rho[row] = codes.score(sts, test.scores)
    rho["float8 per dimension"] = sts_spearman(per_dimension(sentences)(sts), test.scores)
    error, kept = round_trip(sentences)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    text = "\n".join([
        f"Written by `python benchmarks/float8_codes.py {command}` in {clock}. {environment()}. nDCG@10 x 100 and, "
        "in brackets, the share of raw float32 on the same set:", "", *lines, "",
        "STS-B test, Spearman x 100: " + ", ".join(f"{row} {100 * value:.2f}" for row, value in rho.items())
        + f"; round trip on its sentences: max relative error {error:.4f}, mean cosine {kept:.6f}."])
    print(text)


if __name__ == "__main__":
    main()

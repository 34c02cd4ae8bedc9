"""Top-10 search of 300 queries against a 5,183 x 384 corpus (SciFact's sizes) at each precision, with
`skflow.compression.search`, as a ratio to float32 numpy's matrix product ``Q @ D.T`` in the same run.

The vectors are seeded anisotropic Gaussians (speed does not depend on what they mean). Every configuration
runs in this one process on the same threads (numpy's BLAS pool as it starts: printed), after a warm-up;
the configurations alternate over the rounds, and the table gives the median of each. The codes are made
once, before timing (a corpus is quantized when it is stored); the queries' codes are part of each timed
search. Runs in well under a minute. ``--reference PATH`` also times the float searches of another checkout's
``skflow/compression/_search.py`` (rows marked "reference"), in the same rounds: a change measured on a busy machine.

    python benchmarks/search_speed.py [--rounds 15] [--queries 300] [--documents 5183] [--dim 384] [--k 10]
                                      [--reference PATH]
"""

import argparse
import importlib.util
import platform
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info

from skflow import Quantizer
from skflow.compression import _search, search


def vectors(n: int, dim: int, rng: np.random.RandomState) -> np.ndarray:
    mixing = rng.normal(size=(dim, dim)) * np.geomspace(1.0, 0.05, dim)[:, None]
    return (rng.normal(size=(n, dim)) @ mixing + 0.3).astype(np.float32)


def positive(text: str) -> int:
    if (number := int(text)) < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {number}")
    return number


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=15)
    parser.add_argument("--queries", type=positive, default=300)
    parser.add_argument("--documents", type=positive, default=5183)
    parser.add_argument("--dim", type=positive, default=384)
    parser.add_argument("--k", type=positive, default=10)
    parser.add_argument("--reference", help="another skflow checkout whose search is timed beside this one's")
    args = parser.parse_args(argv)
    if args.k > args.documents:
        parser.error(f"--k {args.k} is more than the {args.documents} documents")

    rng = np.random.RandomState(0)
    corpus, queries = vectors(args.documents, args.dim, rng), vectors(args.queries, args.dim, rng)
    int8, binary = Quantizer(precision="int8").fit(corpus), Quantizer(precision="binary").fit(corpus)
    corpus_int8, corpus_bits = int8.transform(corpus), binary.transform(corpus)
    k, shortlist, packed = args.k, max(args.k, min(100, args.documents)), -(-args.dim // 8)

    def rescored(corpus_rows, query_rows, metric):
        _, top = search(binary.transform(queries), corpus_bits, shortlist, metric="hamming")
        return search(query_rows(), corpus_rows, k, metric=metric, candidates=top)

    def popcounts():
        blas_queries, _search.BLAS_QUERIES = _search.BLAS_QUERIES, len(queries) + 1
        try:
            return search(binary.transform(queries), corpus_bits, k, metric="hamming")
        finally:
            _search.BLAS_QUERIES = blas_queries

    configurations = {  # name: (bytes stored per vector, the timed call)
        "float32 matrix product Q @ D.T (reference, no top-k)": (4 * args.dim, lambda: queries @ corpus.T),
        f"float32 cosine, top {k}": (4 * args.dim, lambda: search(queries, corpus, k)),
        f"float32 dot, top {k}": (4 * args.dim, lambda: search(queries, corpus, k, metric="dot")),
        f"int8 integer dot, top {k}": (args.dim, lambda: search(int8.transform(queries), corpus_int8, k,
                                                               metric="dot")),
        f"binary Hamming, top {k}": (packed, lambda: search(binary.transform(queries), corpus_bits, k,
                                                             metric="hamming")),
        f"binary Hamming by XOR and popcount (the path of < 32 queries), top {k}": (packed, popcounts),
        f"binary asymmetric (float query), top {k}": (packed, lambda: search(queries, corpus_bits, k,
                                                                             metric="asymmetric")),
        f"binary Hamming top {shortlist}, rescored with float32": (packed + 4 * args.dim,
                                                                   lambda: rescored(corpus, lambda: queries,
                                                                                    "cosine")),
        f"binary Hamming top {shortlist}, rescored with int8": (packed + args.dim,
                                                                lambda: rescored(corpus_int8,
                                                                                 lambda: int8.transform(queries),
                                                                                 "dot")),
    }
    if args.reference:
        spec = importlib.util.spec_from_file_location("reference_search", f"{args.reference}/skflow/compression/"
                                                      "_search.py")
        reference = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(reference)
        _, top = search(binary.transform(queries), corpus_bits, shortlist, metric="hamming")
        configurations.update({
            f"reference: float32 cosine, top {k}": (4 * args.dim, lambda: reference.search(queries, corpus, k)),
            f"reference: float32 dot, top {k}": (4 * args.dim, lambda: reference.search(queries, corpus, k,
                                                                                         metric="dot")),
            f"reference: binary asymmetric (float query), top {k}": (packed, lambda: reference.search(
                queries, corpus_bits, k, metric="asymmetric")),
            f"float32 rescoring of the Hamming top {shortlist} alone": (4 * args.dim, lambda: search(
                queries, corpus, k, candidates=top)),
            f"reference: float32 rescoring of the Hamming top {shortlist} alone": (4 * args.dim, lambda: (
                reference.search(queries, corpus, k, candidates=top))),
        })
    times = {name: [] for name in configurations}
    for _, call in configurations.values():
        call()  # warm-up
    for _ in range(args.rounds):
        for name, (_, call) in configurations.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)

    blas = sorted({f"{pool['internal_api']} {pool['num_threads']} threads" for pool in threadpool_info()
                   if pool["user_api"] == "blas"})
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    print(f"{args.queries} queries x {args.documents} documents x {args.dim} dimensions, top {k}, "
          f"median of {args.rounds} rounds; numpy {np.__version__} ({', '.join(blas)}); CPU: {model}")
    reference = statistics.median(times[next(iter(configurations))])
    print("\n| search | bytes a stored vector | ms (median) | time / float32 matrix product |")
    print("|---|---:|---:|---:|")
    for name, (size, _) in configurations.items():
        median = statistics.median(times[name])
        print(f"| {name} | {size:,} | {median * 1000:.1f} | {median / reference:.2f}x |")


if __name__ == "__main__":
    main()

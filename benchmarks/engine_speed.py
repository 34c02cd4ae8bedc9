"""Speed and memory of each engine index (faiss, usearch; flat, HNSW; float32, int8, binary; two stages) as ratios
to numpy's exact float32 search (`skflow.compression.search`) in the same run, with build time, bytes per stored
vector and recall@10 against the exact float32 top 10.

The corpus is SciFact's 5,183 document vectors (all-MiniLM-L6-v2, mean pooling, 256 tokens, float32, from an
embedding cache) normalized, tiled to ``--rows`` rows with Gaussian noise (each copy ``v + 0.02 e`` renormalized,
``e`` standard normal in 384 dimensions: a copy keeps a cosine of about 0.93 with its original), searched by SciFact's
300 test queries. The reference is `skflow.compression.search(queries, corpus, 10, metric="dot")` of those unit
vectors (the cosine ranking; ``metric="cosine"`` would normalize the corpus again at each call). Each index is built
once (``fit``: the seconds of its build); its searches alternate with the
others' over ``--rounds`` rounds, the table giving the median: a batch of the 300 queries (seconds a query), and
``--single`` queries one at a time. Every search and build runs on ``--threads`` threads (numpy's BLAS through
threadpoolctl, ``EngineIndex(n_jobs=...)``; default 1: on a machine shared with other jobs, faiss's OpenMP threads
spin while they wait, and two threads of a busy machine measured slower than one). Bytes per vector: the engine's
serialized index (faiss's ``serialize_index``, usearch's ``serialized_length``; usearch's exact search: the array of
rows; numpy: the array), over the rows.

    python benchmarks/engine_speed.py $SKFLOW_RETRIEVAL_DATA/scifact --cache-dir DIR --rows 100000 [--rounds 5]
        [--indexes flat hnsw] [--single 20] [--threads 1]
"""

import argparse
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from engine_study import read_folder
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer
from threadpoolctl import threadpool_info, threadpool_limits

from skflow import BertEmbedder, ITQRotation, Quantizer
from skflow.compression import search
from skflow.engines import EngineIndex, require_engine
from skflow.evaluation import overlap

K = 10
TWO_STAGE = 1000


def tiled(vectors: np.ndarray, rows: int, rng: np.random.RandomState) -> np.ndarray:
    """``rows`` unit vectors: the originals, then noisy copies of them in turn."""
    out = np.empty((rows, vectors.shape[1]), np.float32)
    for start in range(0, rows, len(vectors)):
        part = vectors[: min(len(vectors), rows - start)]
        if start:
            part = part + 0.02 * rng.standard_normal(part.shape).astype(np.float32)
        out[start : start + len(part)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def bytes_per_vector(index: EngineIndex, rows: int) -> float:
    if index.engine == "faiss":
        faiss = require_engine("faiss")
        serialize = faiss.serialize_index_binary if index.precision_ == "binary" else faiss.serialize_index
        return len(serialize(index.index_)) / rows
    if index.index_ is not None:
        return index.index_.serialized_length / rows
    return index.__getstate__()["stored_"].nbytes / rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="SciFact's BEIR-layout folder")
    parser.add_argument("--cache-dir", help="embedding cache")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=20, help="queries searched one at a time")
    parser.add_argument("--indexes", nargs="+", default=["flat", "hnsw"], choices=["flat", "hnsw"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    with threadpool_limits(args.threads):
        measure(args)


def measure(args) -> None:
    data = read_folder(args.folder)
    embedder = BertEmbedder(pooling="mean", max_length=256, dtype="float32", cache_dir=args.cache_dir,
                            show_progress_bar=False)
    rng = np.random.RandomState(0)
    corpus = tiled(Normalizer().transform(embedder.transform(data["corpus"])), args.rows, rng)
    queries = embedder.transform(data["queries"])
    exact = search(queries, corpus, K)[1]

    pipelines = {"float32": None,
                 "int8": make_pipeline(Normalizer(), Quantizer(ranges="symmetric")).fit(corpus),
                 "binary": make_pipeline(ITQRotation(n_iter=0, random_state=0), Quantizer(precision="binary"))
                 .fit(corpus)}
    # numpy's exact search of the unit vectors as the engines store them: the dot (cosine would normalize the
    # corpus again at each call)
    searches = {"numpy, float32, exact": (None, lambda q: search(q, corpus, K, metric="dot"), 0.0,
                                          corpus.nbytes / args.rows)}
    for engine in ("faiss", "usearch"):
        for kind in args.indexes:
            for precision, pipeline in pipelines.items():
                start = time.perf_counter()
                index = EngineIndex(pipeline, engine=engine, index=kind, n_jobs=args.threads).fit(corpus)
                built = time.perf_counter() - start
                size = bytes_per_vector(index, args.rows)
                searches[f"{engine}, {kind}, {precision}"] = (index, lambda q, i=index: i.search(q, K), built, size)
                if precision == "binary" and kind == "hnsw":
                    top = min(TWO_STAGE, args.rows)
                    searches[f"{engine}, {kind}, binary, top {top:,} rescored (asymmetric)"] = (
                        index, lambda q, i=index, t=top: i.search(q, K, rescore=t), 0.0, size)
                print(f"built {engine} {kind} {precision} in {built:.1f} s", flush=True)

    batch, single = {name: [] for name in searches}, {name: [] for name in searches}
    for name, (_, run, _, _) in searches.items():  # warm-up
        run(queries[:2])
    for _ in range(args.rounds):
        for name, (_, run, _, _) in searches.items():
            start = time.perf_counter()
            run(queries)
            batch[name].append((time.perf_counter() - start) / len(queries))
            start = time.perf_counter()
            for query in queries[: args.single]:
                run(query[None])
            single[name].append((time.perf_counter() - start) / args.single)
    reference = statistics.median(batch["numpy, float32, exact"]), statistics.median(single["numpy, float32, exact"])
    blas = ", ".join(f"{i['internal_api']} {i['num_threads']} threads" for i in threadpool_info())
    print(f"\n{args.rows:,} rows x {corpus.shape[1]}, {len(queries)} queries, top {K}; {args.threads} thread(s) of "
          f"{os.cpu_count()} CPUs ({blas}); faiss {version('faiss-cpu')}, usearch {version('usearch')}, numpy "
          f"{np.__version__}, Python {platform.python_version()}; median of {args.rounds} rounds\n")
    print("| index | build (s) | bytes a vector | batch: ms a query | x numpy | one at a time: ms a query | x numpy "
          "| recall@10 vs exact float32 |\n|---|---|---|---|---|---|---|---|")
    for name, (index, run, built, size) in searches.items():
        b, s = statistics.median(batch[name]), statistics.median(single[name])
        recall = overlap(run(queries)[1], exact)
        print(f"| {name} | {built:.1f} | {size:,.0f} | {1000 * b:.3f} | {reference[0] / b:.1f} | {1000 * s:.3f} | "
              f"{reference[1] / s:.1f} | {recall:.3f} |")


if __name__ == "__main__":
    main()

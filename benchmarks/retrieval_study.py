"""Retrieval and compressed vectors: SciFact nDCG@10 for each method x precision x width K, and the same codes on STS.

BEIR SciFact (5,183 abstracts, 300 test queries) is embedded once with the
encoder as MTEB runs it (all-MiniLM-L6-v2: mean pooling, 256 tokens,
float32). Every map and every quantizer is fitted on the corpus only, and
applied to queries and documents alike (``skflow.evaluation``'s protocol).

- Methods at full width (K = 384): ``none``, ``center`` (``Centerer``: the
  mean subtracted), ``pca`` (``Whitener(power=0)``: the centred vectors
  rotated onto their principal axes; the same cosines, other codes),
  ``renorm``, ``whiten``, ``soft-whiten``, ``abtt-1``, ``flow``, ``itq``,
  ``rotation``.
- Methods that reduce to K (384, 256, 128, 64 in the table; also 192, 96,
  48, 32 and 24 for the budgets and the figure): ``truncate`` (the first K raw
  coordinates), ``pca``, ``whiten`` and ``soft-whiten`` (their first K
  directions), ``flow+pca`` (the flow, then PCA to K), ``itq-K``
  (``ITQRotation(n_components=K)``), ``rotation`` (a random rotation of the
  centred vectors, then its first K coordinates).
- Precisions: float32 (4K bytes), int8 (K bytes; cosine of the dequantized
  codes), binary (K/8 bytes; Hamming), binary with float queries
  (``asym``), and the Hamming top 100 rescored in float32 (``rescore``: the
  bits in memory, the float32 vectors read for 100 candidates a query).

The STS part scores the full-width methods at float32, int8 and binary
(Hamming) on every STS set present, fitted on each set's sentences.

    python benchmarks/retrieval_study.py --output docs/retrieval.md --figure docs/figures/retrieval.png \
        --cache-dir DIR
"""

import numpy as np
from _study import Clock, embedded, environment, present_sets, score, write_section

from skflow import BertEmbedder, FlowGaussianizer, ITQRotation, Quantizer, Whitener
from skflow.datasets import load_beir
from skflow.embedding import stock_settings
from skflow.evaluation import SET_LABELS, make_method, retrieval_report, search_stored

KS = (384, 256, 128, 64)  # the table's widths; the budgets and the figure also have those of ``MORE_KS``
MORE_KS = (192, 96, 48, 32, 24)
FULL = ("none", "center", "pca", "renorm", "whiten", "soft-whiten", "abtt-1", "flow", "itq", "rotation")
REDUCING = ("truncate", "pca", "whiten", "soft-whiten", "flow+pca", "itq", "rotation")
PRECISIONS = ("float32", "int8", "binary", "asym", "rescore")
BYTES = {"float32": 4, "int8": 1, "binary": 1 / 8, "asym": 1 / 8, "rescore": 1 / 8}  # stored in memory, a dimension
BUDGETS = (384, 96, 48, 24)
VECTORS = 10**8


def stored(queries: np.ndarray, documents: np.ndarray) -> dict:
    """``{precision: (scores, indices)}``, the top 100 of each query as each precision stores the vectors."""
    found = search_stored(queries, documents, ("float32", "int8", "binary"))
    return {name.removeprefix("binary-"): value for name, value in found.items()}  # asym, rescore


def maps(documents: np.ndarray) -> dict:
    """``{(method, K): fitted row map}`` of every method and width, each fitted on the corpus only."""
    flow = FlowGaussianizer(random_state=0).fit(documents)
    out = {(name, 384): (lambda X: X) if name == "none" else flow.transform if name == "flow" else
           make_method(name).fit(documents).transform for name in FULL}
    flow_pca = Whitener(power=0).fit(flow.transform(documents))
    full = {"pca": Whitener(power=0), "whiten": Whitener(), "soft-whiten": Whitener(power=0.25),
            "rotation": ITQRotation(n_iter=0, random_state=0)}
    full = {name: estimator.fit(documents) for name, estimator in full.items()}
    for k in KS + MORE_KS:
        out[("truncate", k)] = lambda X, k=k: X[:, :k]
        out[("flow+pca", k)] = lambda X, k=k: flow_pca.transform(flow.transform(X))[:, :k]
        out[("itq", k)] = ITQRotation(n_components=k, random_state=0).fit(documents).transform
        for name, estimator in full.items():  # the first K output columns are the method at K
            out[(name, k)] = lambda X, e=estimator, k=k: e.transform(X)[:, :k]
    return out


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="docs/retrieval.md")
    parser.add_argument("--figure", default="docs/figures/retrieval.png")
    parser.add_argument("--cache-dir", help="embedding cache (each text embedded once)")
    parser.add_argument("--no-sts", action="store_true", help="leave out the STS part")
    args = parser.parse_args(argv)
    clock = Clock()
    scifact = load_beir("scifact")
    embedder = BertEmbedder(dtype="float32", cache_dir=args.cache_dir, show_progress_bar=False)
    embedder.set_params(**stock_settings(embedder))
    documents, queries = embedder.transform(scifact.corpus), embedder.transform(scifact.queries)
    print(f"[{clock}] embedded", flush=True)
    results = {}
    for (method, k), transform in maps(documents).items():
        for precision, found in stored(transform(queries), transform(documents)).items():
            report = retrieval_report(*found, scifact.qrels, scifact.query_ids, scifact.corpus_ids)
            results[(method, k, precision)] = 100 * report["ndcg@10"]
        print(f"[{clock}] {method}-{k}: float32 {results[(method, k, 'float32')]:.2f}", flush=True)
    sts = {} if args.no_sts else sts_codes(args.cache_dir, clock)
    raw = results[("none", 384, "float32")]
    lines = report_lines(results, raw, sts, clock, argv, embedder)
    write_section(args.output, "\n".join(lines), before="## Compressed vectors")
    figure(results, raw, args.figure)
    print(f"wrote {args.output} and {args.figure} in {clock}")


def sts_codes(cache_dir, clock) -> dict:
    """``{(method, precision): {set: wmean Spearman x 100}}`` for the full-width methods, on every STS set present."""
    data, _ = present_sets()
    embedder = BertEmbedder(pooling="mean", dtype="float32", cache_dir=cache_dir, show_progress_bar=False)
    out = {}
    for name, train, test, gold, subsets in embedded(data, embedder):
        for method in FULL:
            estimator = make_method(method)
            fitted, latent = (train, test) if estimator is None else (estimator.fit(train).transform(train),
                                                                       estimator.transform(test))
            for precision in ("float32", "int8", "binary"):
                pairs = latent
                if precision != "float32":
                    codes = Quantizer(precision=precision).fit(fitted)
                    pairs = codes.inverse_transform(codes.transform(latent))
                out.setdefault((method, precision), {})[name] = score(pairs, gold, subsets)["wmean"]
        print(f"[{clock}] STS {SET_LABELS[name]} done", flush=True)
    return out


def report_lines(results: dict, raw: float, sts: dict, clock, argv, embedder) -> list[str]:
    import sys

    command = " ".join(sys.argv[1:] if argv is None else argv)

    def cell(method, k, precision):
        value = results[(method, k, precision)]
        return f"{value:.2f} ({100 * value / raw:.1f}%)"

    lines = ["## The study: methods, precisions and widths", "",
             f"Written by `python benchmarks/retrieval_study.py {command}` in {clock}. {environment()}. The encoder "
             f"as MTEB runs it (pooling {embedder.pooling}, {embedder.max_length} tokens, float32); every map and "
             "quantizer fitted on the corpus only. nDCG@10 x 100 on SciFact's 300 test queries, and in brackets the "
             f"share of raw float32 ({raw:.2f}).", "",
             "### Every method at full width (K = 384)", "",
             "| method | float32 (1,536 B) | int8 (384 B) | binary, Hamming (48 B) | binary, float query (48 B) | "
             "binary, top 100 rescored in float32 |", "|---|---|---|---|---|---|"]
    for method in FULL:
        lines.append(f"| {method} | " + " | ".join(cell(method, 384, p) for p in PRECISIONS) + " |")
    lines += ["", "### Fewer dimensions: each reducing method at K = " + ", ".join(map(str, KS)), "",
              "| method | precision | " + " | ".join(f"K = {k}" for k in KS) + " |", "|---|---|" + "---|" * len(KS)]
    for method in REDUCING:
        for precision in PRECISIONS:
            lines.append(f"| {method} | {precision} | " + " | ".join(cell(method, k, precision) for k in KS) + " |")
    lines += ["", "### The best code within a memory budget (without rescoring)", "",
              "Every method, width K and precision whose vector fits the budget; beside the best, the best of raw "
              "truncation and of a random rotation within the same budget.", "",
              f"| bytes a vector | best code | nDCG@10 | share of raw float32 | best truncation | best random rotation "
              f"| {VECTORS:.0e} vectors |", "|---|---|---|---|---|---|---|"]

    def best(budget, methods=None):
        value, method, k, precision = max((value, method, k, p) for (method, k, p), value in results.items()
                                          if p != "rescore" and BYTES[p] * k <= budget
                                          and (methods is None or method in methods))
        return f"{method} at K = {k}, {precision}", value

    for budget in BUDGETS:
        (code, value), baselines = best(budget), [best(budget, (m,)) for m in ("truncate", "rotation")]
        lines.append(f"| {budget} | {code} | {value:.2f} | {100 * value / raw:.1f}% | "
                     + " | ".join(f"{v:.2f} ({c.split(' at ')[1]})" for c, v in baselines)
                     + f" | {budget * VECTORS / 1e9:.1f} GB |")
    if sts:
        sets = list(next(iter(sts.values())))
        lines += ["", "### The same codes on STS", "",
                  "Spearman x 100 (`wmean`, average of " + ", ".join(SET_LABELS[s] for s in sets) + "), mean pooling, "
                  "128 tokens, each map and quantizer fitted on the set's sentences; binary codes scored by Hamming "
                  "distance.", "", "| method | float32 | int8 | binary |", "|---|---|---|---|"]
        for method in FULL:
            values = [np.mean(list(sts[(method, p)].values())) for p in ("float32", "int8", "binary")]
            lines.append(f"| {method} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    lines += ["", "The figure: for each method, the best of its codes (width and precision, no rescoring) that fits "
              "in each size.", "", "![nDCG@10 on SciFact against the bytes stored per vector, one line per method]"
              "(figures/retrieval.png)", ""]
    return lines


def figure(results: dict, raw: float, path: str) -> None:
    """nDCG@10 against bytes per stored vector (log scale), one line per method: its best code (width, precision;
    no rescoring) that fits in that many bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in REDUCING:
        best = {}
        for (m, k, precision), value in results.items():
            if m == method and precision != "rescore":
                size = BYTES[precision] * k
                best[size] = max(best.get(size, 0), value)
        sizes = sorted(best)
        ax.plot(sizes, np.maximum.accumulate([best[s] for s in sizes]), marker="o", label=method)
    ax.axhline(raw, color="black", linewidth=0.8, linestyle="--", label="raw float32")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per stored vector")
    ax.set_ylabel("SciFact nDCG@10 x 100")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

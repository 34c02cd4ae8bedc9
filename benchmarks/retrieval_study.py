"""Retrieval and compressed vectors on every corpus: nDCG@10 of each method x precision x width, as a share of each
corpus's raw float32, every randomised method over several seeds; the codes by memory budget; and the same codes on STS.

Each retrieval set (BEIR SciFact by name, any BEIR-layout folder by path: Cranfield and CISI) is embedded once with
the encoder as MTEB runs it (all-MiniLM-L6-v2: mean pooling, 256 tokens, float32). Every map and every quantizer
is fitted on the corpus only and applied to queries and documents alike (``skflow.evaluation``'s protocol).

- Methods at full width (K = 384): ``none``, ``center``, ``pca``, ``renorm``, ``whiten``, ``soft-whiten``,
  ``abtt-1``, ``flow``, ``itq``, ``rotation``.
- Methods that reduce to K (256, 192, 128, 96, 64, 48, 32, 24): ``truncate`` (the first K raw coordinates),
  ``pca`` (the first K principal directions), ``itq`` (``ITQRotation(n_components=K)``) and ``rotation`` (the same
  K directions under a random rotation, ``ITQRotation(K, n_iter=0)``).
- Precisions: float32 (4K bytes); int8 (K bytes) scored as skflow scores it (the cosine of the dequantized codes)
  and, at full width, as engines that compare int8 codes directly do (the integer dot of
  ``Quantizer(ranges="symmetric")`` codes of the vectors as the map gives them, not normalized: the pitfall;
  ``docs/engines.md`` measures the codes of unit vectors, which keep 100%); binary (K/8 bytes) by Hamming
  distance; binary with the float query
  (``asym``); and at full width the Hamming top 100 rescored in float32 (``rescore``).
- ``flow``, ``itq`` and ``rotation`` are fitted with each of ``--seeds``: tables give the mean over seeds and the
  range.
- A label-free rule for picking a code was looked for: over ``--diagnostic-seeds`` seeds of ``itq`` and ``rotation``
  at 48 bytes, the Spearman correlation across seeds of their nDCG@10 with two fit-time diagnostics (ITQ's
  quantization loss, and the agreement of the codes' top 10 with float32's top 10 for 300 corpus rows used as
  queries), and which code the agreement picks among ``none``, ``center``, ``rotation`` and ``itq``.

    python benchmarks/retrieval_study.py --sets scifact DATA/cranfield DATA/cisi --cache-dir DIR \
        --output docs/retrieval.md --figure docs/figures/retrieval.png --json benchmarks/out/retrieval.json
"""

import numpy as np
from _study import Clock, embedded, environment, present_sets, score, write_numbers, write_section
from scipy.stats import spearmanr

from skflow import BertEmbedder, FlowGaussianizer, ITQRotation, Quantizer
from skflow.compression import search
from skflow.datasets import load_beir
from skflow.embedding import stock_settings
from skflow.evaluation import SET_LABELS, make_method, retrieval_report, search_stored

FULL = ("none", "center", "pca", "renorm", "whiten", "soft-whiten", "abtt-1", "flow", "itq", "rotation")
SEEDED = ("flow", "itq", "rotation")
REDUCING = ("truncate", "pca", "itq", "rotation")
KS = (256, 192, 128, 96, 64, 48, 32, 24)
TABLE_KS = (384, 256, 192, 128, 64)
FULL_PRECISIONS = ("float32", "int8", "int8-dot", "binary", "asym", "rescore")
PRECISIONS = ("float32", "int8", "binary", "asym")
BYTES = {"float32": 4, "int8": 1, "int8-dot": 1, "binary": 1 / 8, "asym": 1 / 8, "rescore": 1 / 8}
BUDGETS = (384, 192, 96, 48, 24)
LABELS = {"float32": "float32", "int8": "int8, cosine of the dequantized codes",
          "int8-dot": "int8, integer dot of the vectors' codes as they are (one symmetric range, no normalization)",
          "binary": "binary, Hamming", "asym": "binary, float query",
          "rescore": "binary, Hamming top 100 rescored in float32"}


def maps(documents: np.ndarray, seeds) -> dict:
    """``{(method, K, seed): fitted row map}``, each fitted on the corpus only (seed None: not randomised)."""
    d = documents.shape[1]
    out = {}
    for name in FULL:
        for seed in (seeds if name in SEEDED else (None,)):
            if name == "none":
                out[(name, d, seed)] = lambda X: X
            elif name == "flow":
                out[(name, d, seed)] = FlowGaussianizer(random_state=seed).fit(documents).transform
            else:
                out[(name, d, seed)] = make_method(name, random_state=seed or 0).fit(documents).transform
    pca = out[("pca", d, None)]
    for k in KS:
        out[("truncate", k, None)] = lambda X, k=k: X[:, :k]
        out[("pca", k, None)] = lambda X, k=k: pca(X)[:, :k]
        for seed in seeds:
            out[("itq", k, seed)] = ITQRotation(n_components=k, random_state=seed).fit(documents).transform
            out[("rotation", k, seed)] = ITQRotation(n_components=k, n_iter=0, random_state=seed).fit(
                documents).transform
    return out


def stored(queries: np.ndarray, documents: np.ndarray, full: bool) -> dict:
    """``{precision: (scores, indices)}``: the top 100 of each query as each precision stores the vectors."""
    found = search_stored(queries, documents, ("float32", "int8", "binary"))
    found = {name.removeprefix("binary-"): value for name, value in found.items()}
    if full:
        codes = Quantizer(precision="int8", ranges="symmetric").fit(documents)
        found["int8-dot"] = search(codes.transform(queries), codes.transform(documents), 100, metric="dot")
    else:
        del found["rescore"]
    return found


def corpus_results(data, queries: np.ndarray, documents: np.ndarray, seeds, clock) -> dict:
    """``{(method, K, precision): [nDCG@10 x 100 of each seed]}`` on one corpus."""
    results = {}
    d = documents.shape[1]
    for (method, k, seed), transform in maps(documents, seeds).items():
        for precision, found in stored(transform(queries), transform(documents), k == d).items():
            report = retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)
            results.setdefault((method, k, precision), []).append(100 * report["ndcg@10"])
    print(f"[{clock}] {data.name}: {len(results)} codes", flush=True)
    return results


def diagnostics(data, queries: np.ndarray, documents: np.ndarray, n_seeds: int) -> dict:
    """Whether a fit-time statistic predicts which 48-byte code retrieves best (no judgements used in the
    statistics; the judgements only score them)."""
    rng = np.random.RandomState(0)
    probes = rng.choice(len(documents), min(300, len(documents) // 4), replace=False)
    exact = search(documents[probes], documents, 11)[1]

    def agreement(transform) -> float:  # the codes' top 10 against float32's, each probe row left out of its own
        mapped = transform(documents)
        bits = Quantizer(precision="binary").fit(mapped).transform(mapped)
        found = search(mapped[probes], bits, 11, metric="asymmetric")[1]
        return float(np.mean([len((set(a) - {p}) & (set(b) - {p})) / 10
                              for a, b, p in zip(exact, found, probes)]))

    def ndcg(transform) -> float:
        mapped, mapped_queries = transform(documents), transform(queries)
        bits = Quantizer(precision="binary").fit(mapped).transform(mapped)
        found = search(mapped_queries, bits, 100, metric="asymmetric")
        return 100 * retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)["ndcg@10"]

    out = {}
    for method, extra in (("itq", {}), ("rotation", {"n_iter": 0})):
        rows = []
        for seed in range(n_seeds):
            fitted = ITQRotation(random_state=seed, **extra).fit(documents)
            rows.append((ndcg(fitted.transform), fitted.quantization_loss_, agreement(fitted.transform)))
        values, losses, agreements = map(np.array, zip(*rows))
        out[method] = {"ndcg": values, "loss_spearman": spearmanr(losses, values)[0],
                       "agreement_spearman": spearmanr(agreements, values)[0], "agreement": agreements}
    center = make_method("center").fit(documents).transform
    candidates = {"none": (lambda X: X), "center": center}
    out["choice"] = {name: (ndcg(f), agreement(f)) for name, f in candidates.items()}
    for method in ("rotation", "itq"):
        out["choice"][method] = (out[method]["ndcg"].mean(), out[method]["agreement"].mean())
    return out


def main(argv=None) -> None:
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_home = os.environ.get("SKFLOW_RETRIEVAL_DATA", "")
    parser.add_argument("--sets", nargs="+", default=["scifact"] + [
        os.path.join(default_home, name) for name in ("cranfield", "cisi")
        if default_home and os.path.isdir(os.path.join(default_home, name))],
        help="retrieval sets: scifact, or paths of folders in BEIR's layout (default: scifact, and cranfield/ and "
        "cisi/ of $SKFLOW_RETRIEVAL_DATA where present)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--diagnostic-seeds", type=int, default=20)
    parser.add_argument("--output", default="docs/retrieval.md")
    parser.add_argument("--figure", default="docs/figures/retrieval.png")
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--cache-dir", help="embedding cache (each text embedded once)")
    parser.add_argument("--no-sts", action="store_true", help="leave out the STS part")
    args = parser.parse_args(argv)
    clock = Clock()
    embedder = BertEmbedder(dtype="float32", cache_dir=args.cache_dir, show_progress_bar=False)
    embedder.set_params(**stock_settings(embedder))
    corpora, diagnosed, sizes = {}, {}, {}
    for name in args.sets:
        data = load_beir(name)
        label = SET_LABELS.get(data.name, data.name)
        documents, queries = embedder.transform(data.corpus), embedder.transform(data.queries)
        print(f"[{clock}] {label} embedded", flush=True)
        sizes[label] = (len(data.corpus), len(data.queries))
        corpora[label] = corpus_results(data, queries, documents, args.seeds, clock)
        diagnosed[label] = diagnostics(data, queries, documents, args.diagnostic_seeds)
        print(f"[{clock}] {label} diagnosed", flush=True)
    sts = {} if args.no_sts else sts_codes(args.cache_dir, args.seeds, clock)
    write_numbers(args.json, {(corpus, *key): values for corpus, results in corpora.items()
                              for key, values in results.items()})
    lines = report_lines(corpora, sizes, diagnosed, sts, clock, argv, embedder, args.seeds)
    write_section(args.output, "\n".join(lines), before="## Compressed vectors")
    figure(corpora, args.figure)
    print(f"wrote {args.output} and {args.figure} in {clock}")


def sts_codes(cache_dir, seeds, clock) -> dict:
    """``{(method, precision): [wmean Spearman x 100 averaged over the STS sets, of each seed]}`` for the full-width
    methods, on every STS set present."""
    data, _ = present_sets()
    embedder = BertEmbedder(pooling="mean", dtype="float32", cache_dir=cache_dir, show_progress_bar=False)
    per_set = {}
    for name, train, test, gold, subsets in embedded(data, embedder):
        for method in FULL:
            for seed in (seeds if method in SEEDED else (0,)):
                estimator = make_method(method, random_state=seed)
                fitted, latent = (train, test) if estimator is None else (estimator.fit(train).transform(train),
                                                                           estimator.transform(test))
                for precision in ("float32", "int8", "binary"):
                    pairs = latent
                    if precision != "float32":
                        codes = Quantizer(precision=precision).fit(fitted)
                        pairs = codes.inverse_transform(codes.transform(latent))
                    per_set.setdefault((method, precision, seed), []).append(score(pairs, gold, subsets)["wmean"])
        print(f"[{clock}] STS {SET_LABELS[name]} done", flush=True)
    out = {}
    for (method, precision, _), values in per_set.items():
        out.setdefault((method, precision), []).append(np.mean(values))
    return out


def summary(values) -> tuple[float, float, float]:
    return float(np.mean(values)), float(np.min(values)), float(np.max(values))


def cell(values, raw: float | None = None) -> str:
    """A table cell: the mean, the range where seeds vary, and the share of raw float32."""
    mean, low, high = summary(values)
    text = f"{100 * mean / raw:.1f}%" if raw else f"{mean:.2f}"
    if high > low:
        text += f" ({100 * low / raw:.1f}-{100 * high / raw:.1f})" if raw else f" ({low:.2f}-{high:.2f})"
    return text


def code_name(method: str, k: int, precision: str, d: int) -> str:
    return f"{method}{'' if k == d else f'-{k}'} {precision}"


def budget_codes(results: dict, budget: float, methods=None) -> dict:
    """``{(method, K, precision): values}`` of the codes (no rescoring) that fit ``budget`` bytes a vector."""
    return {key: values for key, values in results.items()
            if key[2] != "rescore" and BYTES[key[2]] * key[1] <= budget and (methods is None or key[0] in methods)}


def report_lines(corpora: dict, sizes: dict, diagnosed: dict, sts: dict, clock, argv, embedder, seeds) -> list[str]:
    import sys

    command = " ".join(sys.argv[1:] if argv is None else argv)
    names = list(corpora)
    d = max(k for results in corpora.values() for (_, k, _) in results)
    raws = {c: np.mean(corpora[c][("none", d, "float32")]) for c in names}
    lines = ["## The study: every corpus, every method, precision and width", "",
             f"Written by `python benchmarks/retrieval_study.py {command}` in {clock}. {environment()}. The encoder "
             f"as MTEB runs it (pooling {embedder.pooling}, {embedder.max_length} tokens, float32); every map and "
             "quantizer fitted on the corpus only. Each cell is nDCG@10 as a share of the corpus's raw float32 "
             "nDCG@10; `flow`, `itq` and `rotation` give the mean over the seeds "
             f"{', '.join(map(str, seeds))}, and in brackets the range over them.", "",
             "| corpus | documents | test queries | raw float32 nDCG@10 x 100 |", "|---|---|---|---|"]
    for c in names:
        lines.append(f"| {c} | {sizes[c][0]:,} | {sizes[c][1]:,} | {raws[c]:.2f} |")
    lines += ["", f"### Every method at full width (K = {d}), each precision", ""]
    for c in names:
        lines += [f"**{c}** (raw float32 {raws[c]:.2f})", "",
                  "| method | " + " | ".join(f"{LABELS[p]} ({BYTES[p] * d:,.0f} B)" for p in FULL_PRECISIONS) + " |",
                  "|---|" + "---|" * len(FULL_PRECISIONS)]
        for method in FULL:
            lines.append(f"| {method} | " + " | ".join(cell(corpora[c][(method, d, p)], raws[c])
                                                     for p in FULL_PRECISIONS) + " |")
        lines.append("")
    lines += ["### Fewer dimensions: each reducing method at K = " + ", ".join(map(str, TABLE_KS)), ""]
    for c in names:
        lines += [f"**{c}**", "", "| method | precision | " + " | ".join(f"K = {k}" for k in TABLE_KS) + " |",
                  "|---|---|" + "---|" * len(TABLE_KS)]
        for method in REDUCING:
            for p in PRECISIONS:
                keys = [("none" if method == "truncate" and k == d else method, k, p) for k in TABLE_KS]
                lines.append(f"| {method} | {p} | " + " | ".join(cell(corpora[c][key], raws[c]) for key in keys) + " |")
        lines.append("")
    lines += ["### The codes by memory budget (without rescoring)", "",
              "For each budget: on each corpus its best code (the highest mean over seeds), the best truncation and "
              "the best random rotation of the same size; then the one code whose lowest share over the corpora is "
              "the highest (the code to use where nothing is known of the corpus), with its share on each.", "",
              "| bytes a vector | corpus | best code | best truncation | best random rotation |",
              "|---|---|---|---|---|"]
    robust = {}
    for budget in BUDGETS:
        for c in names:
            row = [f"| {budget} | {c} |"]
            for methods in (None, ("truncate", "none"), ("rotation",)):
                codes = budget_codes(corpora[c], budget, methods)
                key = max(codes, key=lambda k: np.mean(codes[k]))
                row.append(f" {code_name(*key, d)}: {cell(codes[key], raws[c])} |")
            lines.append("".join(row))
        shared = set.intersection(*(set(budget_codes(corpora[c], budget)) for c in names))
        robust[budget] = max(shared, key=lambda key: min(np.mean(corpora[c][key]) / raws[c] for c in names))
    lines += ["", "| bytes a vector | the code with the highest lowest share | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    for budget, key in robust.items():
        lines.append(f"| {budget} | {code_name(*key, d)} | " + " | ".join(cell(corpora[c][key], raws[c])
                                                                         for c in names) + " |")
    lines += ["", "### Looking for a rule: do fit-time diagnostics predict the best code?", "",
              f"Over {len(next(iter(diagnosed.values()))['itq']['ndcg'])} seeds of each 48-byte rotation (bits "
              "searched with the float query), the Spearman correlation across seeds between nDCG@10 and ITQ's "
              "quantization loss (lower should be better: a good predictor is near -1), and between nDCG@10 and "
              "the agreement of the codes' top 10 with float32's top 10 for 300 corpus rows used as queries (a "
              "good predictor is near +1); then, among four 48-byte codes, the share of each and the agreement "
              "that would pick one.", "",
              "| corpus | itq: mean share (range) | loss vs nDCG | agreement vs nDCG | rotation: mean share (range) "
              "| loss vs nDCG | agreement vs nDCG |", "|---|---|---|---|---|---|---|"]
    for c in names:
        cells = []
        for method in ("itq", "rotation"):
            diag = diagnosed[c][method]
            cells += [cell(diag["ndcg"], raws[c]), f"{diag['loss_spearman']:+.2f}",
                      f"{diag['agreement_spearman']:+.2f}"]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "| corpus | " + " | ".join(f"{m}: share, agreement" for m in ("none", "center", "rotation", "itq"))
              + " | the agreement picks | the best is |", "|---|---|---|---|---|---|---|"]
    for c in names:
        choice = diagnosed[c]["choice"]
        picked = max(choice, key=lambda m: choice[m][1])
        best = max(choice, key=lambda m: choice[m][0])
        lines.append(f"| {c} | " + " | ".join(f"{100 * choice[m][0] / raws[c]:.1f}%, {choice[m][1]:.3f}"
                                             for m in ("none", "center", "rotation", "itq"))
                     + f" | {picked} | {best} |")
    if sts:
        lines += ["", "### The same codes on STS", "",
                  "Spearman x 100 (`wmean`, the average of the STS sets present), mean pooling, 128 tokens, each map "
                  "and quantizer fitted on the set's sentences; binary codes scored by Hamming distance; `flow`, "
                  "`itq` and `rotation`: the mean over the seeds, and the range.", "",
                  "| method | float32 | int8 | binary |", "|---|---|---|---|"]
        for method in FULL:
            lines.append(f"| {method} | " + " | ".join(cell(sts[(method, p)]) for p in ("float32", "int8", "binary"))
                         + " |")
    lines += ["", "The figure: on each corpus, for each method, the best of its codes (width and precision, no "
              "rescoring; mean over seeds) that fits in each size, as a share of raw float32.", "",
              "![nDCG@10 share of raw float32 against the bytes stored per vector, one panel per corpus]"
              "(figures/retrieval.png)", ""]
    return lines


def figure(corpora: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(corpora), figsize=(5 * len(corpora), 4), sharey=True)
    for ax, (c, results) in zip(np.atleast_1d(axes), corpora.items()):
        d = max(k for (_, k, _) in results)
        raw = np.mean(results[("none", d, "float32")])
        for method in REDUCING:
            best = {}
            for (m, k, p), values in results.items():
                if (m == method or (method == "truncate" and m == "none")) and p != "rescore":
                    size = BYTES[p] * k
                    best[size] = max(best.get(size, 0), 100 * np.mean(values) / raw)
            sizes = sorted(best)
            ax.plot(sizes, np.maximum.accumulate([best[s] for s in sizes]), marker="o", label=method)
        ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_title(c)
        ax.set_xlabel("bytes per stored vector")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("nDCG@10, % of raw float32")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

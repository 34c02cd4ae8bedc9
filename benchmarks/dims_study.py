"""How small can the vectors get: STS Spearman against the number of dimensions K, per method and pooling.

For each pooling and each STS set present (SICK-R too), the embeddings are
reduced to K dimensions, K in ``KS``, by:

- ``truncate``: the first K coordinates (the baseline);
- ``pca``: PCA to K without whitening, ``Whitener(power=0, n_components=K)``;
- ``whiten``: whitening-K, ``Whitener(n_components=K)``;
- ``soft-whiten``: ``Whitener(power=0.25, n_components=K)``;
- ``flow+pca``: ``FlowGaussianizer()`` (fitted once per set), then PCA to K.

Each is fitted on the set's sentences without labels and scored as
``skflow.evaluation.evaluate`` scores (``benchmarks/_study.py``). Writes a
Markdown report (for both protocols, the average over the sets against K;
the recommendation), the per-set numbers as JSON, and a figure of the
average against K.

    python benchmarks/dims_study.py --output docs/results.md --figure docs/figures/dims.png --cache-dir DIR
"""


import numpy as np
from _study import (
    Clock,
    apply,
    embedded,
    line_figure,
    present_sets,
    score,
    section,
    study_parser,
    write_numbers,
    write_section,
)

from skflow import BertEmbedder, FlowGaussianizer, Whitener
from skflow.evaluation import SET_LABELS

KS = (384, 256, 192, 128, 96, 64, 48, 32)
POOLINGS = ("cls", "mean")
METHODS = ("truncate", "pca", "whiten", "soft-whiten", "flow+pca")
VECTORS = 10**8  # the store size the memory column is given for


def reduced(train: np.ndarray, test: np.ndarray, flow: FlowGaussianizer | None) -> dict:
    """``{method: test pairs mapped to all output columns}``, each fitted once on ``train``.

    The first K columns are the method at K: ``Whitener(n_components=K)``'s
    output is the first K of ``Whitener()``'s (the same principal directions
    and scales), and truncation keeps the first K coordinates.
    """
    maps = {"truncate": test}
    for method, power in (("pca", 0), ("whiten", 0.5), ("soft-whiten", 0.25)):
        maps[method] = apply(Whitener(power=power).fit(train).transform, test)
    if flow is not None:
        pca = Whitener(power=0).fit(flow.transform(train))
        maps["flow+pca"] = apply(lambda X: pca.transform(flow.transform(X)), test)
    return maps


def smallest_within(results: dict, pooling: str, methods, sets: list[str], protocol: str, points: float = 1.0):
    """The smallest ``(K, method)`` whose average is within ``points`` of the best average at full width."""
    def average(method, k):
        return np.mean([results[(pooling, method, k)][s][protocol] for s in sets])

    full = max(average(m, KS[0]) for m in methods)
    for k in sorted(KS):
        candidates = [(average(m, k), m) for m in methods if average(m, k) >= full - points]
        if candidates:
            return k, max(candidates)[1], max(candidates)[0], full
    return KS[0], None, full, full


def main(argv=None):
    parser = study_parser(__doc__.splitlines()[0], "dims.png")
    parser.add_argument("--no-flow", action="store_true", help="leave out flow+pca")
    args = parser.parse_args(argv)
    clock = Clock()
    try:
        data, missing = present_sets(args.sets)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    sets = list(data)
    results = {}
    for pooling in POOLINGS:
        embedder = BertEmbedder(pooling=pooling, max_length=128, cache_dir=args.cache_dir, show_progress_bar=False)
        for name, train, test, gold, subsets in embedded(data, embedder):
            flow = None if args.no_flow else FlowGaussianizer(random_state=0).fit(train)
            for method, latent in reduced(train, test, flow).items():
                for k in KS:
                    results.setdefault((pooling, method, k), {})[name] = score(latent[..., :k], gold, subsets)
            print(f"[{clock}] {pooling} {SET_LABELS[name]} done", flush=True)
    methods = [m for m in METHODS if (POOLINGS[0], m, KS[0]) in results]
    def average(pooling, method, k, protocol):
        return np.mean([results[(pooling, method, k)][s][protocol] for s in sets])

    rows = [(pooling, method) for pooling in POOLINGS for method in methods]
    alt = "Spearman against the number of dimensions K, per method and pooling"
    lines = [section("## How small can the vectors get?", "dims_study.py", argv, clock, sets, missing, list(KS), rows,
                     average, "against K", (alt, args.figure, args.output))]
    lines += [f"### The smallest K within 1 point of the full-width best (`wmean` average; {VECTORS:.0e} vectors)",
              "", "| pooling | K | method | average | best at 384 | float32 store | saved |",
              "|---|---|---|---|---|---|---|"]
    for pooling in POOLINGS:
        k, method, value, full = smallest_within(results, pooling, methods, sets, "wmean")
        size = VECTORS * k * 4 / 1e9
        saved = VECTORS * (KS[0] - k) * 4 / 1e9
        lines.append(f"| {pooling} | {k} | {method} | {value:.2f} | {full:.2f} | {size:,.0f} GB | {saved:,.0f} GB |")
    write_section(args.output, "\n".join(lines))
    averages = {p: {m: [average(p, m, k, "wmean") for k in KS] for m in methods} for p in POOLINGS}
    line_figure(averages, list(KS), "dimensions K", f"Spearman x 100, wmean, average of {len(sets)} sets",
                args.figure, log_x=True)
    write_numbers(args.json, results)
    print(f"wrote {args.output} and {args.figure} in {clock}")


if __name__ == "__main__":
    main()

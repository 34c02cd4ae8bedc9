"""Where post-processing pays: STS Spearman of every hidden layer, pooling and label-free method.

For each hidden state of the encoder (0, the embeddings, to the last layer),
pooled by ``mean`` or ``cls`` (``BertEmbedder(layers=L)``), each method of
``METHODS`` is evaluated with ``skflow.evaluation.evaluate`` on every STS set
present (SICK-R too): fitted on the set's sentences without labels, both
protocols. Writes a Markdown report and a figure of the gain over the raw
vectors against the layer, one line per method (seven-set average, wmean).
A method that cannot be fitted (every vector equal: ``cls`` at layer 0 is
the [CLS] input embedding, the same for every sentence) reads n/a.

    python benchmarks/layer_study.py --output docs/results.md --figure docs/figures/layers.png --cache-dir DIR
"""

import argparse
import json
import os
import sys
import warnings

import numpy as np
from _study import Clock, add_set_arguments, cell, environment, present_sets, write_section

from skflow import BertEmbedder
from skflow.embedding import hub_kwargs, load_config, n_hidden_layers, resolve_model_source
from skflow.evaluation import SET_LABELS, evaluate

POOLINGS = ("mean", "cls")
METHODS = ("none", "center", "renorm", "whiten", "soft-whiten", "abtt-4", "flow")


def figure(results: dict, sets: list[str], layers: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(POOLINGS), figsize=(5 * len(POOLINGS), 3.8), sharey=True)
    for ax, pooling in zip(np.atleast_1d(axes), POOLINGS):
        raw = [np.mean([results[(pooling, layer, "none")][s]["wmean"] for s in sets]) for layer in layers]
        for method in METHODS[1:]:
            values = [np.mean([results[(pooling, layer, method)][s]["wmean"] for s in sets]) for layer in layers]
            ax.plot(layers, np.subtract(values, raw), marker="o", label=method)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"pooling {pooling}")
        ax.set_xlabel("hidden layer (0: embeddings)")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel(f"gain over raw, Spearman x 100 (wmean, {len(sets)} sets)")
    np.atleast_1d(axes)[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="docs/results.md",
                        help="the Markdown file whose section this study writes (the rest is kept)")
    parser.add_argument("--figure", default="layers.png")
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--cache-dir", help="embedding cache (each set, layer and pooling embedded once)")
    add_set_arguments(parser)
    parser.add_argument("--layers", nargs="+", type=int, help="default: every hidden state")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # constant features and undefined Spearman: the tables say n/a
    clock = Clock()
    try:
        data, missing = present_sets(args.sets)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    sets = list(data)
    model = BertEmbedder().model_name_or_path
    config = load_config(*resolve_model_source(model, None, None), hub_kwargs(False, None))
    every = list(range(n_hidden_layers(config) + 1))
    if args.layers and not set(args.layers) <= set(every):
        parser.error(f"--layers: the encoder's hidden states are {every[0]} to {every[-1]}, got {args.layers}")
    layers = args.layers or every
    results = {}
    for pooling in POOLINGS:
        for layer in layers:
            embedder = BertEmbedder(pooling=pooling, layers=layer, max_length=128, cache_dir=args.cache_dir,
                                    show_progress_bar=False)
            for method in METHODS:
                try:
                    found = evaluate(embedder, methods=[method], sets=sets, download_if_missing=False)["sets"]
                    values = {s: {p: 100 * found[s][method][p] for p in ("wmean", "all")} for s in sets}
                except ValueError as exc:  # cls at layer 0: one vector for every sentence, nothing to fit
                    print(f"{pooling} layer {layer} {method}: {exc}", flush=True)
                    values = {s: {"wmean": np.nan, "all": np.nan} for s in sets}
                results[(pooling, layer, method)] = values
            print(f"[{clock}] {pooling} layer {layer} done", flush=True)
    lines = [
        "## Where post-processing pays: every hidden layer",
        "",
        f"Written by `python benchmarks/layer_study.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
        f"in {clock}. {environment()}.",
        f"Sets: {', '.join(SET_LABELS[s] for s in sets)}"
        + (f"; left out, their data not present: {', '.join(SET_LABELS[s] for s in missing)}." if missing else "."),
        "",
    ]
    for protocol in ("wmean", "all"):
        lines += [f"### Protocol `{protocol}`: Spearman x 100, average of the sets, by hidden layer", "",
                  "| pooling | method | " + " | ".join(map(str, layers)) + " |", "|---|---|" + "---|" * len(layers)]
        for pooling in POOLINGS:
            for method in METHODS:
                averages = [np.mean([results[(pooling, layer, method)][s][protocol] for s in sets]) for layer in layers]
                lines.append(f"| {pooling} | {method} | " + " | ".join(map(cell, averages)) + " |")
        lines.append("")
    figure_path = os.path.relpath(args.figure, os.path.dirname(os.path.abspath(args.output)))
    lines += [f"![gain over the raw vectors against the hidden layer, per method and pooling]({figure_path})", ""]
    write_section(args.output, "\n".join(lines))
    figure(results, sets, layers, args.figure)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"|".join(map(str, key)): value for key, value in results.items()}, f)
    print(f"wrote {args.output} and {args.figure} in {clock}")


if __name__ == "__main__":
    main()

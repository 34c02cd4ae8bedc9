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

import warnings

import numpy as np
from _study import Clock, line_figure, present_sets, section, study_parser, write_numbers, write_section

from skflow import BertEmbedder
from skflow.embedding import encoder_settings
from skflow.evaluation import evaluate

POOLINGS = ("mean", "cls")
METHODS = ("none", "center", "renorm", "whiten", "soft-whiten", "abtt-4", "flow")


def main(argv=None):
    parser = study_parser(__doc__.splitlines()[0], "layers.png")
    parser.add_argument("--layers", nargs="+", type=int, help="default: every hidden state")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # constant features and undefined Spearman: the tables say n/a
    clock = Clock()
    try:
        data, missing = present_sets(args.sets)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    sets = list(data)
    every = list(range(encoder_settings(BertEmbedder(), device="cpu").n_layers + 1))
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
    def average(pooling, method, layer, protocol="wmean"):
        return np.mean([results[(pooling, layer, method)][s][protocol] for s in sets])

    rows = [(pooling, method) for pooling in POOLINGS for method in METHODS]
    alt = "gain over the raw vectors against the hidden layer, per method and pooling"
    text = section("## Where post-processing pays: every hidden layer", "layer_study.py", argv, clock, sets, missing,
                   layers, rows, average, "by hidden layer", (alt, args.figure, args.output))
    write_section(args.output, text)
    gains = {p: {m: [average(p, m, x) - average(p, "none", x) for x in layers] for m in METHODS[1:]} for p in POOLINGS}
    ylabel = f"gain over raw, Spearman x 100 (wmean, {len(sets)} sets)"
    line_figure(gains, layers, "hidden layer (0: embeddings)", ylabel, args.figure, zero_line=True)
    write_numbers(args.json, results)
    print(f"wrote {args.output} and {args.figure} in {clock}")


if __name__ == "__main__":
    main()

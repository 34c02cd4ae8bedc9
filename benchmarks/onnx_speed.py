"""Transform throughput of a fitted flow: onnxruntime (float32) vs FlowGaussianizer.transform (float64, as
designed) vs the same map in float32 torch; one process, same data, chunks and threads for all three.

The flow is fitted on real embeddings (STS-B, the bundled encoder, CLS pooling, float32); the vectors
transformed are those rows repeated to ``--n-vectors``. Each method runs ``--repeats`` times over all
vectors in chunks of ``--chunk`` rows; the best time counts.

    python benchmarks/onnx_speed.py [--n-vectors 100000] [--chunk 8192] [--threads 2] [--repeats 3]
                                    [--coupling additive|affine] [--permutation reverse|random|lu]
"""

import argparse
import tempfile
import time

import numpy as np
import onnxruntime
import torch

from skflow import BertEmbedder, FlowGaussianizer
from skflow.datasets import load_sts
from skflow.flow_estimator._arrays import LatentMap
from skflow.flow_estimator._scaling import FeatureScaling
from skflow.flows import Glow


def _best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-vectors", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--coupling", default="additive")
    parser.add_argument("--permutation", default="reverse")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pairs = load_sts("stsb").pairs
    rows = BertEmbedder(pooling="cls", dtype="float32", cache_dir=args.cache_dir).transform(pairs).reshape(-1, 384)
    flow = FlowGaussianizer(coupling=args.coupling, permutation=args.permutation, random_state=0).fit(rows)
    X = np.resize(rows, (args.n_vectors, rows.shape[1])).astype(np.float32)

    path = flow.to_onnx(tempfile.mkdtemp() + "/flow.onnx")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    glow = Glow(**flow._flow_config)
    glow.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in flow.flow_.state_dict().items()})
    scaling = FeatureScaling(mean=flow.mean_, scale=flow.scale_, constant=flow.constant_features_)
    torch_map = LatentMap(glow.eval(), scaling, torch.float32).eval()
    chunks = [X[i : i + args.chunk] for i in range(0, len(X), args.chunk)]

    def run_onnx():
        return [session.run(None, {"x": c})[0] for c in chunks]

    @torch.no_grad()
    def run_torch32():
        return [torch_map(torch.from_numpy(c)).numpy() for c in chunks]

    def run_transform():
        return [flow.transform(c) for c in chunks]  # float64 inside, float32 out for float32 input

    expected = np.concatenate([flow.transform(c.astype(np.float64)) for c in chunks[:2]])
    for name, run in (("onnx", run_onnx), ("torch32", run_torch32)):
        got = np.concatenate(run()[:2])
        print(f"{name}: max |z - transform| / max |z| = {np.abs(got - expected).max() / np.abs(expected).max():.2e}")
    runs = (("onnxruntime float32", run_onnx), ("torch float32", run_torch32), ("transform float64", run_transform))
    seconds = {name: _best(run, args.repeats) for name, run in runs}
    print(f"\n{args.n_vectors:,} vectors of 384, chunks of {args.chunk}, {args.threads} threads, "
          f"coupling={args.coupling}, permutation={args.permutation}\n")
    print("| method | vectors/s | ratio onnxruntime / method |")
    print("|---|---|---|")
    for name, s in seconds.items():
        print(f"| {name} | {args.n_vectors / s:,.0f} | {seconds[name] / seconds['onnxruntime float32']:.2f}x |")


if __name__ == "__main__":
    main()

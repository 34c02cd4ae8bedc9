"""Where FlowGaussianizer.fit spends its time: each phase of one fit, and each part of one training step.

The default fit (20,000 x 384 float32, the official configuration, 1 epoch)
is timed with every phase wrapped: validation, the float64 standardisation
(statistics and the float32 training copy), building the flow, the
data-dependent initialisation, the trainer's set-up, and the training loop,
which is split into the steps (gradient, clipping, the loss read back, the
optimiser update) and the rest (batches, the loop). Then one step's parts are
timed alone, 2,000 times each, beside one step of the plain-autograd
normflows Glow of ``benchmarks/flow_speed.py``. Median of ``--repeats`` fits.

    python benchmarks/flow_fit_profile.py [--n-train 20000] [--dim 384] [--repeats 5]
"""

import argparse
import statistics
import time
from collections import defaultdict

import numpy as np
import torch
from _timing import accumulate_time

import skflow.flow_estimator._trainer as trainer_module
import skflow.gaussianizer as gaussianizer_module
from skflow import FlowGaussianizer
from skflow.flows import OfficialGlowGradient
from skflow.flows.glow import Glow
from skflow.synthetic import make_anisotropic_mixture

TIMES: dict[str, float] = defaultdict(float)


def _timed(owner, name: str, label: str) -> None:
    accumulate_time(owner, name, TIMES, label)


def _instrument() -> None:
    _timed(gaussianizer_module, "validate_embeddings", "validate_data")
    _timed(gaussianizer_module.FeatureScaling, "fit", "standardisation: statistics (float64)")
    _timed(gaussianizer_module, "training_rows", "standardisation: float32 training rows")
    _timed(FlowGaussianizer, "_new_flow", "building the flow")
    _timed(Glow, "data_init", "data-dependent initialisation")
    _timed(trainer_module.FlowTrainer, "__init__", "trainer set-up (flat parameters)")
    _timed(trainer_module.FlowTrainer, "run", "training loop")
    _timed(OfficialGlowGradient, "__call__", "  step: loss and gradient")
    _timed(trainer_module, "clip_grad_norm", "  step: gradient clipping")
    _timed(trainer_module, "adam_weight_decay_update", "  step: optimiser update")


def profile_fit(X: np.ndarray, repeats: int) -> list[tuple[str, float, float]]:
    FlowGaussianizer(max_epochs=1, random_state=0, device="cpu").fit(X[:640])  # warm-up
    _instrument()
    runs = []
    for seed in range(repeats):
        TIMES.clear()
        start = time.perf_counter()
        flow = FlowGaussianizer(max_epochs=1, random_state=seed, device="cpu").fit(X)
        TIMES["fit"] = time.perf_counter() - start
        TIMES["  steps"] = flow._trainer.n_steps
        runs.append(dict(TIMES))
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    step_parts = sum(v for k, v in median.items() if k.startswith("  step:"))
    median["  the rest: batches, loss read back, checks, loop"] = median["training loop"] - step_parts
    phases = sum(median[k] for k in median if not k.startswith(" ") and k != "fit")
    median["outside the phases (fit's own code)"] = median["fit"] - phases
    return [(k, v, v / median["fit"]) for k, v in median.items() if k != "  steps"], int(median["  steps"])


def profile_step(X: np.ndarray, n: int = 2000) -> dict[str, float]:
    """Microseconds per call of each part of one step, alone."""
    flow = FlowGaussianizer(max_epochs=1, random_state=0, device="cpu").fit(X[:4096])
    trainer = flow._trainer
    batch = torch.from_numpy(((X[:64] - flow.mean_) / flow.scale_).astype(np.float32))
    grad = trainer.parameters.grad

    def per_call(fn) -> float:
        for _ in range(50):
            fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e6

    return {
        "loss and gradient": per_call(lambda: trainer._official_gradient(batch, trainer._bits_per_nat)),
        "gradient clipping": per_call(lambda: trainer_module.clip_grad_norm(grad, 1.0)),
        "optimiser update": per_call(lambda: trainer_module.adam_weight_decay_update(
            [trainer.parameters], [grad], [trainer.exp_avg], [trainer.exp_avg_sq], lr=0.0, weight_decay=0.01,
            lr_scales=[trainer._lr_scales])),
        "whole step (FlowTrainer.step, lr 0)": per_call(_frozen_step(trainer, batch)),
        "normflows step (autograd, AdamW, clip)": per_call(_normflows_step(X)),
    }


def _frozen_step(trainer, batch):
    trainer.learning_rate = 0.0
    return lambda: trainer.step(batch)


def _normflows_step(X: np.ndarray):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from flow_speed import build_normflows_glow

    torch.manual_seed(0)
    model = build_normflows_glow(X.shape[1], 3, 3, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.01)
    batch = torch.from_numpy(X[:64])

    def step():
        loss = -model.log_prob(batch, None).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-train", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    X = make_anisotropic_mixture(args.n_train, args.dim, df=6.0, random_state=0).astype(np.float32)
    rows, steps = profile_fit(X, args.repeats)
    print(f"FlowGaussianizer.fit, {args.n_train:,} x {args.dim}, 1 epoch ({steps} steps), "
          f"median of {args.repeats}, torch threads {torch.get_num_threads()}\n")
    print("| phase | ms | share of fit |\n|---|---|---|")
    for label, seconds, share in rows:
        print(f"| {label.strip() if not label.startswith(' ') else '&nbsp;&nbsp;' + label.strip()} "
              f"| {seconds * 1e3:,.1f} | {share:.1%} |")
    print("\n| one step's part, alone (2,000 calls) | µs per call |\n|---|---|")
    for label, micros in profile_step(X).items():
        print(f"| {label} | {micros:,.0f} |")


if __name__ == "__main__":
    main()

"""benchmarks/flow_fit_profile.py still times every phase of a fit (its wrappers follow the names it patches)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPT = """
import json, numpy as np, flow_fit_profile as p
X = np.random.default_rng(0).normal(size=(1500, 12)).astype(np.float32)
rows, steps = p.profile_fit(X, 1)
print(json.dumps({"rows": [[label.strip(), seconds, share] for label, seconds, share in rows], "steps": steps}))
"""


@pytest.mark.slow
def test_the_profile_times_every_phase_and_they_add_up_to_the_fit():
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=BENCHMARKS, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    times = {label: seconds for label, seconds, _ in result["rows"]}
    assert result["steps"] == 1500 // 64  # one epoch of batches of 64, the last partial one dropped
    phases = ["validate_data", "standardisation: statistics (float64)", "standardisation: float32 training rows",
              "building the flow", "data-dependent initialisation", "trainer set-up (flat parameters)",
              "training loop", "outside the phases (fit's own code)"]
    assert all(times[name] > 0 for name in phases[:-1])  # every wrapper was called
    assert abs(sum(times[name] for name in phases) - times["fit"]) < 1e-9
    step_parts = [k for k in times if k.startswith("step:")]
    assert len(step_parts) == 3 and sum(times[k] for k in step_parts) < times["training loop"]

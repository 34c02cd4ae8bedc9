"""The tuning study's code path (benchmarks/flow_search.py) on a tiny grid, on real STS-B embeddings."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def flow_search():
    spec = importlib.util.spec_from_file_location("flow_search", ROOT / "benchmarks" / "flow_search.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_runs_on_a_tiny_grid_and_writes_its_section(flow_search, sts_data_home, cache_dir, tmp_path):
    data_home = tmp_path / "data"  # two of the sets: the study reads those it finds
    data_home.mkdir()
    for folder in ("STSBenchmark", "STS12-en-test"):
        (data_home / folder).symlink_to(sts_data_home / folder)
    grid = {"learning_rate": [1e-3, 1e-4], "permutation": ["reverse", "lu"]}
    out = flow_search.study(["cls"], grid, cache_dir=cache_dir, data_home=data_home, n_folds=2,
                            log=lambda message: None)
    result = out["cls"]
    assert len(result["configs"]) == 4 and result["n_diverged"] == 0
    for config in result["configs"]:
        assert 0.6 < config["spearman"] < 0.9 and np.isfinite(config["loglik"])  # CLS raw: ~0.73 on STS-B
    lu = [c["loglik"] for c in result["configs"] if c["params"]["permutation"] == "lu"]
    reverse = [c["loglik"] for c in result["configs"] if c["params"]["permutation"] == "reverse"]
    assert min(lu) > max(reverse)  # the LU flow models the embeddings better, measured on held-out pairs
    picks = result["picks"]
    assert picks["loglik"]["params"]["permutation"] == "lu"
    assert picks["spearman"]["spearman"] == max(c["spearman"] for c in result["configs"])
    sets = set(result["sts"]["none"])
    assert sets == {"stsb", "sts12"} and all(set(row) == sets for row in result["sts"].values())
    assert 70 < result["sts"]["none"]["stsb"] < 76 and result["sts"]["whiten"]["stsb"] > 77
    assert -1 <= result["likelihood_vs_spearman"] <= 1

    section = flow_search.markdown(out, "python benchmarks/flow_search.py --tiny", "figures/tuning.png")
    assert section.startswith("## Tuning") and "| flow (best likelihood) |" in section
    advice = flow_search.recommendation(out)
    assert advice.startswith("### What the study says") and "rank correlations cls" in advice
    document = tmp_path / "results.md"
    document.write_text("# Results\n\n## Protocol\n\nx\n\n## Anisotropy\n\ny\n")
    flow_search.replace_section(document, section)
    flow_search.replace_section(document, section)  # idempotent: replaced, not added twice
    text = document.read_text()
    assert text.count("## Tuning") == 1 and text.index("## Tuning") < text.index("## Anisotropy")
    flow_search.plot(out, tmp_path / "tuning.png")
    assert (tmp_path / "tuning.png").stat().st_size > 10_000

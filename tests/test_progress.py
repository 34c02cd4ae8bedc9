"""What the flow prints while it trains: nothing with ``verbose=0``, a progress bar on stderr with ``verbose=1``
(``fit`` and ``partial_fit``), and the CLI's ``evaluate`` shows that bar unless ``--quiet``; in a notebook without
ipywidgets, the text bar without tqdm's warning."""

import subprocess
import sys

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

from skflow import FlowGaussianizer
from skflow.cli import main
from skflow.evaluation import make_method
from skflow.synthetic import make_anisotropic_mixture

X = make_anisotropic_mixture(640, 8, random_state=0)
SMALL = {"n_levels": 1, "depth": 1, "hidden_channels": 8, "random_state": 0}


def _last_draw(err: str) -> str:
    """The bar as last drawn (tqdm redraws the line after a carriage return)."""
    return err.rstrip("\n").split("\r")[-1]


def test_verbose_0_prints_nothing(capsys):
    flow = FlowGaussianizer(**SMALL).fit(X)
    flow.partial_fit(X[:100])
    assert capsys.readouterr() == ("", "")


def test_verbose_1_shows_a_bar_for_fit_with_every_epochs_batches_the_epoch_and_the_loss(capsys):
    flow = FlowGaussianizer(max_epochs=2, verbose=1, **SMALL).fit(X)
    out, err = capsys.readouterr()
    assert out == ""
    last = _last_draw(err)
    # 640 rows in batches of 64: 10 a epoch, 2 epochs
    assert last.startswith("FlowGaussianizer.fit: 100%") and " 20/20 " in last and "epoch=2" in last, last
    assert float(last.split("nll=")[1].rstrip("]")) == pytest.approx(flow.loss_curve_[-1], abs=20)
    assert err.count("\n") == 1  # one bar, closed once


def test_verbose_1_shows_a_bar_for_each_partial_fit_call(capsys):
    flow = FlowGaussianizer(verbose=1, **SMALL)
    flow.partial_fit(X[:100])  # 64 + 36: the last batch smaller
    flow.partial_fit(X[100:300])
    err = capsys.readouterr().err
    bars = [_last_draw(line) for line in err.strip("\n").split("\n")]
    assert [bar.split("|")[0] for bar in bars] == ["FlowGaussianizer.partial_fit: 100%"] * 2
    assert " 2/2 " in bars[0] and " 4/4 " in bars[1] and "epoch=1" in bars[1]


@pytest.mark.parametrize("verbose", [-1, 0.5, "yes", None])
def test_verbose_is_an_int_of_at_least_0(verbose):
    with pytest.raises(InvalidParameterError, match="The 'verbose' parameter of FlowGaussianizer must be"):
        FlowGaussianizer(verbose=verbose).fit(X)


@pytest.mark.parametrize("quiet", [False, True])
def test_evaluate_shows_the_flows_bar_unless_quiet(monkeypatch, tmp_path, capsys, quiet):
    def fake_evaluate(embedder, *, random_state, flow_params, **kwargs):  # the CLI's flow, fitted as evaluate does
        make_method("flow", random_state=random_state, flow_params={**flow_params, "max_epochs": 1}).set_params(
            n_levels=1, depth=1).fit(X)
        return {"sets": {}, "skipped": {}}

    monkeypatch.setattr("skflow.cli.evaluate", fake_evaluate)
    main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), *(["--quiet"] if quiet else [])])
    err = capsys.readouterr().err
    assert ("FlowGaussianizer.fit: 100%" in err) is not quiet and (" 10/10 " in err) is not quiet
    np.testing.assert_equal(list(tmp_path.iterdir()), [])


@pytest.mark.slow  # a process of its own: about 5 s
def test_a_notebook_without_ipywidgets_gets_the_text_bar_and_no_warning():
    """tqdm.auto picks its widget bar in a Jupyter kernel; without ipywidgets it warned "IProgress not found" first."""
    code = ("import sys, types, warnings\n"
            "warnings.simplefilter('always')\n"
            "sys.modules['IPython'] = types.SimpleNamespace(get_ipython=lambda: types.SimpleNamespace())\n"
            "sys.modules['ipykernel.zmqshell'] = types.ModuleType('ipykernel.zmqshell')  # as in a Jupyter kernel\n"
            "sys.modules['ipywidgets'] = None\n"
            "from skflow.utils import progress_bar\n"
            "with progress_bar('fit', 2, enabled=True) as update:\n"
            "    update(); update()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "IProgress" not in done.stderr and "fit: 100%" in done.stderr and " 2/2 " in done.stderr

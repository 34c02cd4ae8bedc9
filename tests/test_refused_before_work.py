"""Sizes that cannot work are refused in one line before any embedding or training (they used to fail after
about 70 s of embedding, or were accepted and ran for days)."""

import pytest

from skflow import FlowGaussianizer
from skflow.cli import main
from skflow.evaluation import evaluate
from skflow.gaussianizer import MAX_EPOCHS


@pytest.fixture
def nothing_is_embedded(monkeypatch):
    from skflow.embedding import _encoding

    monkeypatch.setattr(_encoding, "encode_ids", lambda *a, **k: pytest.fail("encoded before the check"))
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))


@pytest.mark.parametrize(("method", "needed"), [("whiten-100000", 100000), ("whiten-385", 385), ("abtt-384", 385)])
def test_a_method_wider_than_the_encoder_is_refused_from_its_configuration(tmp_path, capsys, nothing_is_embedded,
                                                                          method, needed):
    args = ["evaluate", "--method", "none", method, "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: method {method!r} needs {needed} dimensions, but "
                   "'sentence-transformers/all-MiniLM-L6-v2' embeds 384."), err
    assert list(tmp_path.iterdir()) == []


def test_the_widest_methods_that_fit_pass_the_check(monkeypatch):
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("x")))
    from skflow import BertEmbedder

    results = evaluate(BertEmbedder(), methods=["whiten-384", "abtt-383"], sets=["stsb"], skip_missing=True)
    assert results["sets"] == {} and "stsb" in results["skipped"]  # got past the check, to the data


@pytest.mark.parametrize("epochs", [MAX_EPOCHS + 1, 100_000_000_000])
def test_epochs_beyond_the_bound_are_refused(tmp_path, capsys, nothing_is_embedded, epochs):
    with pytest.raises(ValueError, match=rf"'max_epochs' parameter of FlowGaussianizer must be an int in the range "
                                         rf"\[1, {MAX_EPOCHS}\]"):
        FlowGaussianizer(max_epochs=epochs).fit([[0.0, 1.0], [1.0, 0.0]])
    for argv in (["evaluate", "--method", "flow", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"],
                 ["fit", str(tmp_path), "--output", str(tmp_path / "m.skops")]):
        with pytest.raises(SystemExit) as exit_:  # the parser, as the help says: "an integer from 1 to 10000"
            main([*argv, "--epochs", str(epochs)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"must be an int in the range [1, {MAX_EPOCHS}], got '{epochs}'" in err
    FlowGaussianizer(max_epochs=MAX_EPOCHS)._validate_params()  # the bound itself is accepted

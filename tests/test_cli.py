"""``python -m skflow evaluate`` end to end on STS-B, and the paper's claim on CLS pooling."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import spearmanr

from skflow import BertEmbedder, Centerer, MeanDirectionRemover, Whitener
from skflow.cli import main
from skflow.datasets import load_sts
from skflow.evaluation import METHODS, PRECISIONS, evaluate, make_method
from skflow.metrics import sts_spearman


def test_evaluate_stsb_end_to_end_and_the_flow_fixes_cls_anisotropy(sts_data_home, cache_dir, tmp_path):
    """The command on STS-B with CLS pooling, and the paper's point: raw CLS vectors are anisotropic, the flow raises
    Spearman by 3+ points. (CLS rows: the STS-B embeddings that other tests read from the session's cache.)"""
    env = dict(os.environ, SKFLOW_DATA=str(sts_data_home), HF_HUB_OFFLINE="1")
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "skflow", "evaluate", "--sets", "stsb", "--pooling", "cls", "--protocol", "wmean",
         "all", "--output", str(out), "--cache-dir", str(cache_dir)],
        # a bound on a hang, not on speed: with other jobs sharing 2 cores (a load of 20) it ran past 15 minutes
        capture_output=True, text=True, env=env, timeout=3600,
    )
    assert run.returncode == 0, run.stderr
    assert "| method | STS-B | Avg |" in run.stdout and "protocol `all`" in run.stdout
    assert "[STS-B] embedding" in run.stderr and "BertEmbedder" in run.stderr  # progress
    assert "FlowGaussianizer.fit: 100%" in run.stderr  # the flow's bar: 17,256 rows, 269 batches of 64
    assert " 269/269 " in run.stderr
    results = json.loads(out.with_suffix(".json").read_text())
    stsb = results["sets"]["stsb"]
    assert list(stsb) == ["none", "whiten", "soft-whiten", "flow"]
    assert stsb["none"]["subsets"]["test"]["n_pairs"] == 1379
    raw, flow = stsb["none"]["wmean"], stsb["flow"]["wmean"]
    assert 0.72 < raw < 0.75  # docs/results.md: 73.42, whitening 79.37, soft whitening 79.58, the flow 78.43
    assert flow - raw >= 0.03 and flow < 0.81
    for method in ("whiten", "soft-whiten"):
        assert 0.77 < stsb[method]["wmean"] < 0.82
    assert results["config"]["pooling"] == "cls"
    table = out.with_suffix(".md").read_text()
    assert f"| none | {100 * raw:.2f} | {100 * raw:.2f} |" in table and "| flow |" in table
    assert "pooling cls" in table


def test_the_default_pooling_of_evaluate_is_the_papers(monkeypatch, tmp_path):
    """first_last_avg, the paper's "last2avg" (the end-to-end run above names CLS)."""
    seen = {}

    def record(embedder, **kwargs):
        seen["pooling"] = embedder.pooling
        raise SystemExit(0)

    monkeypatch.setattr("skflow.cli.evaluate", record)
    with pytest.raises(SystemExit):
        main(["evaluate", "--sets", "stsb", "--quiet", "--output", str(tmp_path / "results")])
    assert seen == {"pooling": "first_last_avg"}


def test_missing_sets_are_skipped_by_default_and_errors_are_clean(sts_data_home, cache_dir, tmp_path, capsys):
    home = tmp_path / "data"
    shutil.copytree(sts_data_home / "STSBenchmark", home / "STSBenchmark")
    code = main(["evaluate", "--data-home", str(home), "--no-download", "--method", "none", "--quiet",
                 "--cache-dir", str(cache_dir), "--output", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 0
    assert "| method | STS-B | Avg |" in captured.out and "(skipped sts12: data not found)" in captured.out
    code = main(["evaluate", "--sets", "sickr", "--data-home", str(home), "--no-download", "--quiet"])
    assert code == 2 and "SICK/SICK_test_annotated.txt" in capsys.readouterr().err
    code = main(["evaluate", "--sets", "stsb", "--method", "centre", "--quiet", "--data-home", str(home)])
    assert code == 2 and "Unknown method 'centre'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", "--pooling", "maximum"])  # not a pooling: a usage error before any work


def test_make_method():
    assert make_method("none") is None
    expected = {
        "pca": dict(power=0, n_remove=0, n_components=None),
        "whiten": dict(power=0.5, n_remove=0, n_components=None),
        "whiten-256": dict(power=0.5, n_remove=0, n_components=256),
        "soft-whiten": dict(power=0.25, n_remove=0, n_components=None),
        "abtt-3": dict(power=0, n_remove=3, n_components=None),
        "pca-64": dict(power=0, n_remove=0, n_components=64),
    }
    for name, params in expected.items():
        method = make_method(name)
        assert isinstance(method, Whitener) and {k: method.get_params()[k] for k in params} == params
    assert make_method("flow", random_state=3, flow_params={"max_epochs": 2}).get_params()["max_epochs"] == 2
    assert isinstance(make_method("renorm"), MeanDirectionRemover)
    assert isinstance(make_method("center"), Centerer)  # not Whitener(power=0), which also rotates: "pca"
    itq = {name: make_method(name, random_state=5).get_params() for name in ("itq", "itq-64", "rotation")}
    assert [(p["n_components"], p["n_iter"], p["random_state"]) for p in itq.values()] == [
        (None, 50, 5), (64, 50, 5), (None, 0, 5)]
    for bad in ("whitening", "abtt-0", "whiten-0", "soft-whiten-2", "abtt", "pca-0", "centre", "renorm-2", "itq-0",
                "rotation-2"):
        with pytest.raises(ValueError, match="valid methods are none, center, whiten, whiten-K"):
            make_method(bad)


def test_every_method_of_evaluate_is_the_library_estimator(sts_data_home, cache_dir):
    methods = ["center", "whiten", "whiten-128", "soft-whiten", "abtt-2", "pca-64", "renorm"]
    embedder = BertEmbedder(pooling="cls", cache_dir=cache_dir, show_progress_bar=False)
    results = evaluate(embedder, methods=methods, sets=["stsb"], data_home=sts_data_home)["sets"]["stsb"]
    full = load_sts("stsb", data_home=sts_data_home)
    embeddings = embedder.transform(full.pairs)
    test = embeddings[full.subsets == "test"]
    for method in methods:
        latent = make_method(method).fit(embeddings.reshape(-1, 384)).transform(test)
        assert results[method]["wmean"] == pytest.approx(sts_spearman(latent, full.scores[full.subsets == "test"]))
    assert 0.77 < results["soft-whiten"]["wmean"] < 0.81  # CLS of all-MiniLM-L6-v2: 0.790 measured
    assert results["whiten-128"]["wmean"] != results["whiten"]["wmean"]


def test_device_reaches_the_encoder_and_the_flow(monkeypatch, tmp_path):
    seen = {}

    def fake_evaluate(embedder, *, random_state, flow_params, **kwargs):
        seen["encoder"] = embedder.device
        seen["flow"] = make_method("flow", random_state=random_state, flow_params=flow_params).device
        return {"sets": {}, "skipped": {}}

    monkeypatch.setattr("skflow.cli.evaluate", fake_evaluate)
    main(["evaluate", "--device", "cpu", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"])
    assert seen == {"encoder": "cpu", "flow": "cpu"}


def test_a_method_that_cannot_work_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))
    assert main(["evaluate", "--method", "whiten-0", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Unknown method 'whiten-0'") and "K >= 1" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_results_are_strict_json_and_undefined_values_read_n_a(tmp_path, monkeypatch, capsys):
    report = {"subsets": {"test": {"spearman": float("nan"), "n_pairs": 3}}, "wmean": float("nan"),
              "mean": float("nan"), "all": float("nan"), "fit_seconds": 0.1}
    monkeypatch.setattr("skflow.cli.evaluate", lambda *a, **k: {"sets": {"stsb": {"none": report}}, "skipped": {}})
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 0

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    results = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    assert results["sets"]["stsb"]["none"]["wmean"] is None
    table = (tmp_path / "r.md").read_text()
    assert "| none | n/a | n/a |" in table and "nan" not in table


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "option, message",
    [
        (["--output", "{tmp}/missing/r"], "missing: the folder of the output cannot be written (No such file"),
        (["--output", "{tmp}/file/r"], "file: the folder of the output cannot be written (Not a directory)"),
        (["--output", "{tmp}/folder.json"], "folder.json: exists and is not a results file"),
        (["--output", "/proc/skflow-r"], "/proc: the folder of the output cannot be written"),
        (["--cache-dir", "{tmp}/file"], "file' is a file, not a folder"),
        (["--cache-dir", "{tmp}/file/sub"], "cannot be used: Not a directory"),
        (["--epochs", "0"], "argument --epochs: must be an int in the range [1, 10000], got '0'"),  # as its help says
        (["--epochs", "100000000000"],
         "argument --epochs: must be an int in the range [1, 10000], got '100000000000'"),
        (["--batch-size", "0"], "argument --batch-size: must be an int in the range [1, inf), got '0'"),
        (["--seed", "-1"], "argument --seed: must be an int in the range [0, 4294967295], got '-1'"),
        (["--seed", "4294967296"], "argument --seed: must be an int in the range [0, 4294967295], got '4294967296'"),
        (["--max-length", "١٢٨"], "argument --max-length: must be an int in the range [2, inf), got '١٢٨'"),
        (["--model", ""], "the model path is empty"),
    ],
)
def test_user_errors_are_one_line_and_exit_2_before_any_encoding(tmp_path, capsys, monkeypatch, option, message):
    from skflow.embedding import _encoding as _encoding

    monkeypatch.setattr(_encoding, "encode_ids", lambda *a, **k: pytest.fail("encoded before the check"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.json").mkdir()
    args = ["evaluate", "--sets", "stsb", "--method", "flow", "--output", str(tmp_path / "r"), "--quiet"]
    args += [part.format(tmp=tmp_path) for part in option]
    try:
        code = main(args)
    except SystemExit as exit_:  # a usage error: the parser exits
        code = exit_.code
    assert code == 2
    assert message in _one_line_error(capsys)


def test_results_are_printed_before_a_failing_write_and_not_lost(tmp_path, capsys, monkeypatch):
    report = {"subsets": {"test": {"spearman": 0.5, "n_pairs": 3}}, "wmean": 0.5, "mean": 0.5, "all": 0.5,
              "fit_seconds": 0.1}
    monkeypatch.setattr("skflow.cli.evaluate", lambda *a, **k: {"sets": {"stsb": {"none": report}}, "skipped": {}})

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pathlib.Path.write_text", disk_full)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert "| none | 50.00 |" in out
    assert err.startswith("error: the results are printed above, but writing them failed") and err.count("\n") == 1


def _fake_results(monkeypatch, spearman=0.5, during=None):
    """``evaluate`` replaced by one that returns a report at once (after calling ``during``)."""
    report = {"subsets": {"test": {"spearman": spearman, "n_pairs": 3}}, "wmean": spearman, "mean": spearman,
              "all": spearman, "fit_seconds": 0.1}

    def fake(*args, **kwargs):
        if during is not None:
            during()
        return {"sets": {"stsb": {"none": report}}, "skipped": {}}

    monkeypatch.setattr("skflow.cli.evaluate", fake)


def test_results_files_are_replaced_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    _fake_results(monkeypatch, spearman=0.25)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 0
    previous = {name: (tmp_path / name).read_text() for name in ("r.json", "r.md")}
    _fake_results(monkeypatch)
    real_write_text = type(tmp_path).write_text

    def half_then_disk_full(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pathlib.Path.write_text", half_then_disk_full)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    assert "writing them failed" in capsys.readouterr().err
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_text() for name in ("r.json", "r.md")} == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]  # no half-written temporary left
    _fake_results(monkeypatch)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 0
    assert "| none | 50.00 |" in (tmp_path / "r.md").read_text()  # its own results are replaced by the next run


def _plant(tmp_path, name, kind):
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "elsewhere.md").write_text("| a table | someone keeps |\n")
        path.symlink_to(tmp_path / "elsewhere.md")
    else:
        path.write_text(kind)
    return path


@pytest.mark.parametrize("name, kind", [
    ("README.md", "# My project\n\nNotes the user wrote.\n"),
    ("README.md", "| a table | of the user's |\n"),
    ("README.md", ""),
    ("README.json", json.dumps({"sets": {}, "config": {"mine": 1}})),
    ("README.json", "not json"),
    ("README.md", "fifo"),
    ("README.md", "link"),
])
def test_evaluate_never_replaces_a_file_it_did_not_write(tmp_path, capsys, monkeypatch, name, kind):
    """``--output README`` replaced the user's README.md with the results table."""
    _fake_results(monkeypatch, during=lambda: pytest.fail("evaluated before the output was checked"))
    planted = _plant(tmp_path, name, kind)
    before = _unchanged(tmp_path)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "README"), "--quiet"]) == 2
    err = _one_line_error(capsys)
    assert f"{planted}: exists and is not a results file that skflow evaluate wrote" in err
    assert _unchanged(tmp_path) == before


def _unchanged(folder):
    """What a write would change of each entry (not its access time: reading a file to recognise it sets it)."""
    return {p.name: (lambda s: (s.st_mode, s.st_ino, s.st_size, s.st_mtime_ns))(os.lstat(p)) for p in folder.iterdir()}


def test_a_file_that_appears_or_changes_during_the_run_is_not_replaced(tmp_path, capsys, monkeypatch):
    notes = tmp_path / "r.md"
    _fake_results(monkeypatch, during=lambda: notes.write_text("# written by the user during the run\n"))
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    assert "r.md: exists and is not a results file" in _one_line_error(capsys)
    assert notes.read_text() == "# written by the user during the run\n" and not (tmp_path / "r.json").exists()
    _fake_results(monkeypatch)
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "s"), "--quiet"]) == 0
    _fake_results(monkeypatch, during=lambda: (tmp_path / "s.json").write_text('{"mine": true}'))
    assert main(["evaluate", "--sets", "stsb", "--output", str(tmp_path / "s"), "--quiet"]) == 2
    assert (tmp_path / "s.json").read_text() == '{"mine": true}'


_EMPTY, _BREAK, _NOT_UTF8 = "must not be empty", "must not hold a line break or another control character", \
    "must be valid UTF-8"


@pytest.mark.parametrize("option, value, problem", [
    ("--output", "", f"{_EMPTY}, got ''"), ("--output", " ", f"{_EMPTY}, got ' '"),
    ("--output", ".", "must name a file, not a folder, got '.'"),
    ("--output", "results/", "must name a file, not a folder, got 'results/'"),
    ("--output", "..", "must name a file, not a folder, got '..'"),
    ("--output", "a\nb", f"{_BREAK}, got 'a\\nb'"), ("--output", "a\u2028b", f"{_BREAK}, got 'a\\u2028b'"),
    ("--output", "a\udcff", f"{_NOT_UTF8}, got 'a\\xff'"),  # what Python makes of the argv bytes b"a\xff"
    ("--cache-dir", "", f"{_EMPTY}, got ''"), ("--cache-dir", "c\nd", f"{_BREAK}, got 'c\\nd'"),
    ("--data-home", "", f"{_EMPTY}, got ''"), ("--data-home", "data\n", f"{_BREAK}, got 'data\\n'"),
])
def test_names_that_are_not_names_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, option,
                                                                        value, problem):
    """``--output ""`` wrote ``..json`` and ``..md``; ``--cache-dir ""`` cached into the current folder; a line
    break or a byte that is not UTF-8 in a name passed."""
    _fake_results(monkeypatch, during=lambda: pytest.fail("evaluated despite a name that is not one"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--sets", "stsb", "--quiet", option, value])
    assert info.value.code == 2
    assert _one_line_error(capsys) == f"error: argument {option}: {problem} (see python -m skflow evaluate --help)"
    assert list(tmp_path.iterdir()) == []


def test_usage_errors_are_one_line_too(capsys):
    for args in (["evaluate", "--bogus"], [], ["evaluate", "--method"], ["evaluate", "--sets", "sts17"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "--help" in err, err


def test_every_set_is_verified_before_anything_is_embedded(sts_data_home, tmp_path, capsys, monkeypatch):
    from skflow.embedding import _encoding as _encoding

    for folder in ("STS12-en-test", "STS16-en-test"):
        shutil.copytree(sts_data_home / folder, tmp_path / folder)
    gold = tmp_path / "STS16-en-test" / "STS.gs.headlines.txt"
    gold.write_bytes(gold.read_bytes()[:-50])  # the last set is damaged
    monkeypatch.setattr(_encoding, "encode_ids", lambda *a, **k: pytest.fail("embedded before all data was verified"))
    code = main(["evaluate", "--sets", "sts12", "sts16", "--data-home", str(tmp_path), "--output", str(tmp_path / "r"),
                 "--quiet"])
    assert code == 2 and "STS.gs.headlines.txt: sha256" in capsys.readouterr().err


def test_command_defaults_are_the_estimators_defaults():
    """The Ray commands show and pass on BertEmbedder's and FlowGaussianizer's own defaults (no copies)."""
    from skflow import FlowGaussianizer
    from skflow.cli import _parser

    embed = vars(_parser().parse_args(["embed", "in.txt", "--output", "out"]))
    fit = vars(_parser().parse_args(["fit", "emb", "--output", "m.skops"]))
    embedder, flow = BertEmbedder().get_params(), FlowGaussianizer().get_params()
    assert embed["model"] == embedder["model_name_or_path"]
    for key in ("pooling", "max_length", "batch_size", "dtype"):
        assert embed[key] == embedder[key], key
    assert fit["epochs"] == flow["max_epochs"]
    for key in ("batch_size", "learning_rate", "weight_decay", "n_levels", "depth", "hidden_channels", "coupling",
                "permutation", "device"):
        assert fit[key] == flow[key], key


def _accepted_values(action) -> list[str] | None:
    """What a command takes for ``action``, read from the code: argparse's choices, or the lists in the errors of
    ``make_method`` and ``resolve_device`` (which check ``--method`` and ``--device``); None for free values."""
    from skflow.utils import resolve_device

    if action.choices is not None and not isinstance(action.choices, dict):  # a dict: the subcommands
        return [str(choice) for choice in action.choices]
    if action.dest == "method":
        with pytest.raises(ValueError) as error:
            make_method("?")
        listed = re.sub(r"\([^)]*\)", "", re.search(r"valid methods are (.*)\.$", str(error.value)).group(1))
        return [name for name in re.findall(r"[a-z][\w-]*", listed) if name != "and"]
    if action.dest == "device":
        with pytest.raises(ValueError) as error:
            resolve_device("?")
        return re.findall(r"'([^']+)'", str(error.value).split(", got")[0])
    return None


def _options_with_values():
    from skflow.cli import _parser

    parser = _parser()
    for command, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            values = _accepted_values(action)
            if values:
                yield command, sub, action, values


def _names(values, text: str) -> list[str]:
    """Those of ``values`` that ``text`` does not name as a whole word."""
    return [value for value in values if not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w:-])", text)]


def test_every_help_text_lists_every_value_its_option_takes():
    """``evaluate --help`` listed none, whiten, whiten-K, flow for --method; center, soft-whiten, abtt-D exist too."""
    seen = set()
    for command, sub, action, values in _options_with_values():
        seen.add((command, action.option_strings[0]))
        text = sub._get_formatter()._expand_help(action) if action.help else ""
        assert not _names(values, text), (command, action.option_strings, _names(values, text), text)
    assert {("evaluate", "--method"), ("evaluate", "--pooling"), ("evaluate", "--device"), ("embed", "--dtype"),
            ("fit", "--coupling"), ("fit", "--permutation"), ("fit", "--device")} <= seen
    methods = [action for _, _, action, _ in _options_with_values() if action.dest == "method"]
    forms = _accepted_values(methods[0])
    assert set(METHODS) <= set(forms)
    assert {"center", "abtt-D", "whiten-K", "soft-whiten", "pca", "pca-K", "renorm"} <= set(forms)
    for form in forms:  # each form the help names is one that the command takes
        assert form == "none" or make_method(re.sub(r"-[KD]$", "-3", form)) is not None


def _all_options():
    from skflow.cli import _parser

    parser = _parser()
    for command, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            yield command, sub, action


def _parses(sub, action, value: str) -> bool:
    """Whether ``sub`` takes ``value`` for ``action``, its required arguments given (a usage error: exit 2)."""
    argv = []
    for other in sub._actions:
        if other is not action and not other.option_strings:
            argv.append("x")
        elif other is not action and other.required:
            argv += [other.option_strings[0], "x"]
    try:
        sub.parse_args([*argv, f"{action.option_strings[0]}={value}"])
    except SystemExit as exit_:
        assert exit_.code == 2
        return False
    return True


_OTHER_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")  # Arabic-Indic: int() and float() read them


def test_every_option_has_a_help_text():
    """``embed --output``, ``--text-column``, ``fit --column``, ``--depth``, ``transform --output-column``...
    had none: ``--help`` showed the name alone."""
    missing = [(command, action.option_strings or action.dest) for command, _, action in _all_options()
               if not (action.help or "").strip() or action.help == "==SUPPRESS=="]
    assert missing == []


def test_every_stated_range_is_what_the_parser_takes_at_its_bounds(capsys):
    """A numeric option's help states its range ("an int in the range [1, 10000]", "... [1, inf)", "a float in the
    range (0.0, inf)", "... [0.0, inf)"), and the parser takes each bound and refuses past it; ``--seed`` said no
    range, ``--depth`` had no help, and ``--batch-size 0`` or ``--learning-rate -1`` passed the parser."""
    forms = {  # scikit-learn's words (its Interval's str), as its InvalidParameterError says them
        r"an int in the range \[(-?[0-9]+), ([0-9]+)\]":
            lambda lo, hi: ([lo, hi], [str(int(lo) - 1), str(int(hi) + 1)]),
        r"an int in the range \[(-?[0-9]+), inf\)": lambda lo: ([lo, str(int(lo) + 10**12)], [str(int(lo) - 1), "1.5"]),
        r"a float in the range \[(-?[0-9.]+), inf\)":
            lambda lo: ([lo, "1e300"], [repr(float(lo) - 1e-9), "nan", "inf"]),
        r"a float in the range \((-?[0-9.]+), inf\)":
            lambda lo: ([repr(float(lo) + 1e-12), "1e300"], [lo, "nan", "inf"]),
    }
    numeric = set()
    for command, sub, action in _all_options():
        if not action.option_strings or action.choices is not None or action.nargs == 0 or action.type is None:
            continue
        if _parses(sub, action, "not-a-number") or not any(_parses(sub, action, v) for v in ("0", "1", "2", "0.5")):
            continue  # a path or a name
        numeric.add((command, action.option_strings[0]))
        stated = [(pattern, re.search(pattern, action.help)) for pattern in forms]
        stated = [(pattern, match) for pattern, match in stated if match]
        assert len(stated) == 1, (command, action.option_strings, action.help)
        pattern, match = stated[0]
        taken, refused = forms[pattern](*match.groups())
        refused.append(match.group(1).translate(_OTHER_DIGITS))  # the bound in another script's digits
        for value in taken:
            assert _parses(sub, action, value), (command, action.option_strings, value)
        for value in refused:
            assert not _parses(sub, action, value), (command, action.option_strings, value)
    capsys.readouterr()
    assert {("evaluate", "--seed"), ("fit", "--seed"), ("fit", "--depth"), ("fit", "--learning-rate"),
            ("fit", "--weight-decay"), ("embed", "--gpus-per-worker"), ("evaluate", "--epochs"),
            ("embed", "--max-length"), ("transform", "--workers")} <= numeric


@pytest.mark.parametrize("name", ["whiten-0", "whiten-٣", "abtt-３", "whiten-𝟓", "whiten-" + "9" * 5000])
def test_a_method_number_in_other_digits_is_refused_before_any_work(tmp_path, capsys, monkeypatch, name):
    """``whiten-٣`` was ``Whitener(n_components=3)`` (the regex's \\d takes every script's digits) and
    ``evaluate --method whiten-٣`` started embedding."""
    with pytest.raises(ValueError, match="K >= 1 in digits 0-9"):
        make_method(name)
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))
    assert main(["evaluate", "--method", name, "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: Unknown method {name!r}; valid methods are none, center, whiten, whiten-K (K >= 1 "
                          "in digits 0-9, e.g. whiten-256)") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_docs_list_every_value_each_option_takes():
    """Some table row or paragraph of docs/ that names the option lists every value it takes."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    units = []
    for path in sorted(docs.glob("*.md")):
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            units += block.splitlines() if block.lstrip().startswith("|") else [" ".join(block.split())]
    for command, _, action, values in _options_with_values():
        option = action.option_strings[0]
        naming = [unit for unit in units if f"`{option}`" in unit]
        assert any(not _names(values, unit) for unit in naming), (command, option, values, naming)


# measured: STS-B test Spearman x 100 of int4 and int2 codes (CLS pooling; float32: 73.4 raw, 79.4 whitened)
INT4_INT2_STSB = {"none": [73.52, 74.35], "whiten": [79.14, 78.62]}


def test_sts_at_each_precision_is_scored_through_the_codes(sts_data_home, cache_dir):
    """int8 codes by the cosine of their dequantized vectors, float8 codes by the cosine of their numbers, binary
    codes by Hamming distance, each quantizer fitted on the set's sentences after the method."""
    embedder = BertEmbedder(pooling="cls", cache_dir=cache_dir, show_progress_bar=False)
    results = evaluate(embedder, methods=["none", "whiten"], sets=["stsb"], data_home=sts_data_home,
                       precisions=PRECISIONS)["sets"]["stsb"]
    assert list(results) == ["none", "none/int8", "none/float8", "none/binary", "none/int4", "none/int2", "whiten",
                             "whiten/int8", "whiten/float8", "whiten/binary", "whiten/int4", "whiten/int2"]
    full = load_sts("stsb", data_home=sts_data_home)
    embeddings, test = embedder.transform(full.pairs), full.subsets == "test"
    signs = Whitener().fit(embeddings.reshape(-1, 384)).transform(embeddings[test]) > 0
    hamming = (signs[:, 0] != signs[:, 1]).sum(axis=1)
    assert results["whiten/binary"]["wmean"] == pytest.approx(spearmanr(-hamming, full.scores[test]).statistic)
    for method in ("none", "whiten"):
        assert abs(results[f"{method}/int8"]["wmean"] - results[method]["wmean"]) < 0.005  # 256 levels
        assert abs(results[f"{method}/float8"]["wmean"] - results[method]["wmean"]) < 0.005  # 4 significant bits
    # measured: raw CLS 73.4 in float32, 78.1 as signs (their Hamming distance ignores the few dimensions that
    # dominate the cosine of anisotropic vectors); whitened 79.4 in float32, 77.8 as signs
    assert results["none"]["wmean"] + 0.03 < results["none/binary"]["wmean"] < results["whiten"]["wmean"]
    assert 0.7 < results["whiten/binary"]["wmean"] < results["whiten"]["wmean"]
    for method in ("none", "whiten"):  # int4 and int2: the cosine of the levels of both sentences' codes
        int4, int2 = (results[f"{method}/{precision}"]["wmean"] for precision in ("int4", "int2"))
        assert [round(100 * value, 2) for value in (int4, int2)] == INT4_INT2_STSB[method], (method, int4, int2)
    with pytest.raises(ValueError, match=r"Unknown precisions \['int3'\]; valid ones are float32, int8, float8, "
                                         "binary, int4, int2"):
        evaluate(embedder, sets=["stsb"], precisions=["int3"])
    with pytest.raises(ValueError, match="^precisions is empty; give one or more of float32, int8, float8, binary, "
                                         "int4, int2.$"):
        evaluate(embedder, sets=["stsb"], precisions=[])  # was "Unknown precisions True"


@pytest.mark.slow  # a process of its own: about 8 s
def test_a_scale_command_without_ray_says_which_packages_to_install(tmp_path):
    """Without Ray Data, ``embed`` is one line naming the packages (not "skflow[ray]": that name on PyPI is another
    project's), exit 2, nothing written."""
    source, output = tmp_path / "texts.txt", tmp_path / "out"
    source.write_text("hello\n", encoding="utf-8")
    code = ("import sys; sys.modules['ray'] = None\n"
            f"from skflow.cli import main; sys.exit(main(['embed', {str(source)!r}, '--output', {str(output)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not output.exists()
    assert done.stderr.strip() == ('error: skflow embed needs Ray Data: pip install "ray[data]>=2.60" "fsspec[http]" '
                                   "(skflow's ray extra) (import of ray halted; None in sys.modules)")

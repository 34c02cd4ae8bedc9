"""Fitted elsewhere: ``evaluate(fit_on=...)`` and ``--fit-on``, each method fitted on another corpus (a named set's
sentences, a train split, the user's own texts) once, and applied to every set."""

import json
import zlib

import numpy as np
import pytest
from sklearn.utils import Bunch

from skflow import BertEmbedder, Centerer, Quantizer, Whitener
from skflow.cli import main
from skflow.datasets import load_sts
from skflow.evaluation import FIT_CORPORA, evaluate, make_method
from skflow.metrics import sts_report, sts_spearman


class _SpyWhitener(Whitener):
    """A Whitener that records the shape of what it is fitted on (the class keeps it: evaluate clones)."""

    fitted: list = []
    seen: list = []

    transformed: list = []

    def fit(self, X, y=None):
        type(self).fitted.append(np.shape(X))
        type(self).seen.append(np.array(X))
        return super().fit(X, y)

    def transform(self, X):
        type(self).transformed.append(np.shape(X))
        return super().transform(X)


class _HashedEncoder(BertEmbedder):
    """No model: each text's 8 numbers are drawn from a seed of its bytes (the same text, the same vector, whatever
    the batch); records the settings and texts of every call (the class keeps them: evaluate clones)."""

    calls: list = []

    def transform(self, X):
        texts = np.asarray(X, dtype=object)
        if texts.size:
            type(self).calls.append((self.pooling, self.max_length, tuple(texts.ravel())))
        return np.asarray([np.random.default_rng(zlib.crc32(t.encode())).normal(size=8) for t in texts.ravel()],
                          np.float32).reshape(*texts.shape, 8)


def _small_sets(monkeypatch):
    """Loaders of a small STS-B (30 train, 10 dev, 20 test pairs), STS16 (25 pairs) and SciFact (40 documents,
    6 queries), in place of the real files; returns them by name."""
    def sts(prefix, splits):
        subsets = np.asarray([split for split, n in splits.items() for _ in range(n)], dtype=object)
        pairs = np.asarray([[f"{prefix} {split} pair {i} left", f"{prefix} {split} pair {i} right"]
                            for i, split in enumerate(subsets)], dtype=object)
        return Bunch(pairs=pairs, scores=np.arange(len(subsets), dtype=float) % 5, subsets=subsets)

    ids = [f"d{i}" for i in range(40)]
    sets = {"stsb": sts("stsb", {"train": 30, "dev": 10, "test": 20}), "sts16": sts("sts16", {"headlines": 25}),
            "scifact": Bunch(corpus_ids=ids, corpus=[f"title {i} abstract {i}" for i in range(40)],
                             query_ids=[f"q{i}" for i in range(6)], queries=[f"claim {i}" for i in range(6)],
                             qrels={f"q{i}": {f"d{i}": 1} for i in range(6)}, n_unjudged_queries=0, verified=True)}
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda name, **kwargs: sets[name])
    monkeypatch.setattr("skflow.evaluation.load_beir", lambda name, **kwargs: sets[name])
    return sets


def test_named_corpora_are_the_sets_texts_documents_not_queries(monkeypatch):
    """stsb-train: both sentences of each train pair, no dev or test one; scifact: the documents, never a query."""
    sets = _small_sets(monkeypatch)
    _SpyWhitener.seen.clear()
    monkeypatch.setattr("skflow.evaluation.make_method", lambda name, **kw: None if name == "none" else _SpyWhitener())
    encoder = _HashedEncoder()
    results = evaluate(encoder, methods=["whiten"], sets=["sts16"], fit_on=["stsb-train", "scifact"])
    assert list(results["sets"]["sts16"]) == ["whiten@stsb-train", "whiten@scifact"]
    assert results["fit_on"] == {"stsb-train": 60, "scifact": 40}
    train = sets["stsb"].pairs[:30].ravel()
    assert list(train[:3]) == ["stsb train pair 0 left", "stsb train pair 0 right", "stsb train pair 1 left"]
    np.testing.assert_array_equal(_SpyWhitener.seen[0], encoder.transform(train))
    np.testing.assert_array_equal(_SpyWhitener.seen[1], encoder.transform(sets["scifact"].corpus))


def test_a_set_that_is_also_a_fitting_corpus_is_embedded_and_fitted_once(monkeypatch):
    """--sets stsb scifact --fit-on target stsb scifact (the docs' command): STS-B's sentences and SciFact's
    documents are embedded once for each encoder setting, and each method fitted once on each, not again for the
    rows METHOD@stsb and METHOD@scifact (the same texts as the target)."""
    sets = _small_sets(monkeypatch)
    _SpyWhitener.fitted.clear()
    _HashedEncoder.calls.clear()
    monkeypatch.setattr("skflow.evaluation.make_method", lambda name, **kw: None if name == "none" else _SpyWhitener())
    results = evaluate(_HashedEncoder(pooling="cls"), methods=["none", "whiten"], sets=["scifact", "stsb"],
                       fit_on=["target", "stsb", "scifact"], precisions=["float32", "int8"])
    stsb, scifact = tuple(sets["stsb"].pairs.ravel()), tuple(sets["scifact"].corpus)
    embedded = [(pooling, max_length, texts) for pooling, max_length, texts in _HashedEncoder.calls
                if texts != tuple(sets["scifact"].queries)]
    # SciFact with the encoder's own settings (mean, 256): its documents, then STS-B as a fitting corpus; STS-B
    # with the settings given: its pairs, then SciFact's documents as a fitting corpus
    assert embedded == [("mean", 256, scifact), ("mean", 256, stsb), ("cls", 128, stsb), ("cls", 128, scifact)]
    assert _SpyWhitener.fitted == [(40, 8), (120, 8), (120, 8), (40, 8)]
    for rows in results["retrieval"]["scifact"], results["sets"]["stsb"]:
        for suffix in "", "/int8":
            for key in set(rows["whiten" + suffix]) - {"fit_seconds"}:
                named = "whiten@stsb" if rows is results["sets"]["stsb"] else "whiten@scifact"
                assert rows["whiten" + suffix][key] == rows[named + suffix][key]


@pytest.mark.slow
def test_each_method_is_fitted_once_on_each_corpus_and_scored_on_every_set(sts_data_home, cache_dir, monkeypatch):
    embedder = BertEmbedder(pooling="cls", cache_dir=cache_dir, show_progress_bar=False)
    dev = load_sts("stsb", split="dev", data_home=sts_data_home).pairs.ravel()[:1000]
    _SpyWhitener.fitted.clear()
    monkeypatch.setattr("skflow.evaluation.make_method", lambda name, **kw: None if name == "none" else _SpyWhitener())
    with pytest.warns(UserWarning, match="fitted on 1,000 rows of 384 features"):  # the few rows of "dev"
        results = evaluate(embedder, methods=["none", "whiten"], sets=["stsb", "sts16"], data_home=sts_data_home,
                           fit_on=["target", "stsb-train", ("dev", dev)], precisions=["float32", "int8"])
    rows = ["none", "none/int8", "whiten", "whiten/int8", "whiten@stsb-train", "whiten@stsb-train/int8",
            "whiten@dev", "whiten@dev/int8"]
    assert list(results["sets"]["stsb"]) == rows and list(results["sets"]["sts16"]) == rows
    assert results["fit_on"] == {"target": None, "stsb-train": 2 * 5749, "dev": 1000}
    # each set's own sentences for each set; STS-B's train split and the user's texts once for both sets
    assert _SpyWhitener.fitted == [(2 * 8628, 384), (2 * 5749, 384), (1000, 384), (2 * 1186, 384)]
    full = load_sts("stsb", data_home=sts_data_home)
    test = full.subsets == "test"
    train = embedder.transform(full.pairs[full.subsets == "train"]).reshape(-1, 384)
    latent = Whitener().fit(train).transform(embedder.transform(full.pairs[test]))
    stsb = {row: report["wmean"] for row, report in results["sets"]["stsb"].items()}
    assert stsb["whiten@stsb-train"] == pytest.approx(sts_spearman(latent, full.scores[test]))
    # measured (CLS): raw 73.4; whitened on all of STS-B 79.4, on its train split only 79.2 (BERT-flow's "train"
    # setting), on 1,000 dev sentences 72.1 (shrunk toward the identity); on STS16 the same fits give 79.2, 79.0, 78.5
    assert stsb["none"] + 0.04 < stsb["whiten@stsb-train"] < stsb["whiten"] + 0.005
    assert stsb["whiten@dev"] < stsb["whiten@stsb-train"] - 0.03
    sts16 = {row: report["wmean"] for row, report in results["sets"]["sts16"].items()}
    assert sts16["none"] + 0.015 < sts16["whiten@stsb-train"] < sts16["whiten"] + 0.005
    for row in rows[3::2]:  # int8 codes with ranges from the fitting corpus: within 0.5 points of float32
        assert abs(stsb[row] - stsb[row.removesuffix("/int8")]) < 0.005, row


@pytest.mark.slow
def test_fit_on_a_file_from_the_command_line(sts_data_home, cache_dir, tmp_path, capsys):
    """The user's texts, read as embed reads them: JSON lines with a text column, one row per line."""
    texts = load_sts("stsb", split="train", data_home=sts_data_home).pairs.ravel()[:2000]
    corpus = tmp_path / "my corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "sentence": text}) + "\n" for i, text in enumerate(texts)))
    out = tmp_path / "results"
    code = main(["evaluate", "--sets", "stsb", "--method", "center", "none", "--pooling", "cls", "--fit-on",
                 str(corpus), "--text-column", "sentence", "--cache-dir", str(cache_dir), "--output", str(out),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    results = json.loads(out.with_suffix(".json").read_text())
    assert list(results["sets"]["stsb"]) == ["none", "center@my corpus.jsonl"]  # the raw vectors, whatever the corpus
    assert results["fit_on"] == {"my corpus.jsonl": 2000}
    assert results["config"]["fit_on"] == [str(corpus)]
    full = load_sts("stsb", data_home=sts_data_home)
    test = full.subsets == "test"
    embedder = BertEmbedder(pooling="cls", cache_dir=cache_dir, show_progress_bar=False)
    center = Centerer().fit(embedder.transform(texts))
    expected = sts_spearman(center.transform(embedder.transform(full.pairs[test])), full.scores[test])
    assert results["sets"]["stsb"]["center@my corpus.jsonl"]["wmean"] == pytest.approx(expected)
    assert "| center@my corpus.jsonl | " in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("fit_on, message", [
    (["stsb-trian"], "error: --fit-on stsb-trian: neither a corpus (target, sts12, sts13, sts14, sts15, sts16, stsb, "
                     "sickr, scifact, stsb-train, sickr-train) nor a file or folder ("),
    (["target", "target"], "error: the fitting corpus 'target' is given twice."),
    (["{dir}/bad.txt"], "error: {dir}/bad.txt: line 2 is not valid UTF-8"),
    (["{dir}/empty.txt"], "error: the fitting corpus 'empty.txt' must be a sequence of two texts or more, got 0."),
    (["{dir}/one.txt"], "error: the fitting corpus 'one.txt' must be a sequence of two texts or more, got 1."),
    (["{dir}/a/t.txt", "{dir}/b/t.txt"], "error: --fit-on {dir}/a/t.txt and {dir}/b/t.txt would both give rows "
                                         "METHOD@t.txt (a file's rows are named by its file name): rename one"),
    (["stsb", "{dir}/stsb/"], "error: --fit-on stsb and {dir}/stsb/ would both give rows METHOD@stsb"),
    (["{dir}/rows.jsonl"], "error: {dir}/rows.jsonl: no column 'text' (columns: sentence)"),
    (["{dir}/a@b.txt"], "error: the fitting corpus 'a@b.txt' needs a name of its own: not empty, no '@', '/', '|' or "
                        "line break, none of target, sts12,"),
])
def test_a_fitting_corpus_that_cannot_work_is_refused_before_any_work(fit_on, message, tmp_path, capsys,
                                                                      monkeypatch):
    for name, data in {"bad.txt": b"fine\n\xff\xfe\n", "empty.txt": b"\n  \n", "rows.jsonl": b'{"sentence": "a"}\n',
                       "a@b.txt": b"a text\n", "one.txt": b"a whole document on one line\n", "a/t.txt": b"a\nb\n",
                       "b/t.txt": b"c\nd\n", "stsb/t.txt": b"e\nf\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))
    out = tmp_path / "out" / "r"
    out.parent.mkdir()
    fit_on = [corpus.format(dir=tmp_path) for corpus in fit_on]
    assert main(["evaluate", "--sets", "stsb", "--fit-on", *fit_on, "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(dir=tmp_path)) and err.count("\n") == 1, err
    assert list(out.parent.iterdir()) == []


def test_fit_on_is_checked_in_python_too(monkeypatch):
    embedder = BertEmbedder()
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))
    for fit_on, message in [
        ("target", "fit_on must be a non-empty sequence of corpora, e.g. ['target', 'stsb-train'], got 'target'."),
        ([], "fit_on must be a non-empty sequence of corpora"),
        (["nli"], "Unknown fitting corpus 'nli'; give one of target, sts12,"),
        ([("stsb", ["a text"])], "the fitting corpus 'stsb' needs a name of its own"),
        ([("mine", [])], "the fitting corpus 'mine' must be a sequence of two texts or more, got 0."),
        ([("mine", ["one text"])], "the fitting corpus 'mine' must be a sequence of two texts or more, got 1."),
        ([("mine", [["a", "b"], ["c", "d"]])], "the fitting corpus 'mine' must be a sequence of two texts or more, "
                                               "got an array of shape (2, 2)."),
        ([("mine", ["a text", None])], "the fitting corpus 'mine': BertEmbedder expects strings, but the element at "
                                       "position 1 is None of type NoneType."),
        ([("mine", "one string")], "the fitting corpus 'mine': BertEmbedder expects a sequence of texts, got a "
                                   "single string"),
        ([("a/b", ["a text"])], "the fitting corpus 'a/b' needs a name of its own"),
        ([["mine", ["a text"] * 100_000]], "Unknown fitting corpus ['mine', ['a text', 'a text', 'a text', 'a text', "
                                           "'a text', 'a text', ...]]; give one of target,"),
    ]:
        with pytest.raises(ValueError) as error:
            evaluate(embedder, methods=["none"], sets=["stsb"], fit_on=fit_on)
        assert str(error.value).startswith(message) and len(str(error.value)) < 400, str(error.value)[:500]
    assert FIT_CORPORA[0] == "target" and {"stsb-train", "sickr-train", "scifact"} <= set(FIT_CORPORA)


def test_a_folder_given_as_a_dot_names_its_rows_by_its_own_name(tmp_path, monkeypatch):
    """``--fit-on .`` (or ``./``, ``..``): rows METHOD@<the folder's name>, not METHOD@."""
    folder = tmp_path / "my texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("one\ntwo\n")
    (folder / "sub" / "b.txt").write_text("three\nfour\n")
    monkeypatch.chdir(folder / "sub")
    given = []

    def stop(embedder, *, fit_on, **kwargs):
        given.extend(fit_on)
        raise ValueError("stopped")

    monkeypatch.setattr("skflow.cli.evaluate", stop)
    assert main(["evaluate", "--sets", "stsb", "--fit-on", "./", "..", "--output", str(tmp_path / "r"), "--quiet"]) == 2
    assert given == [("sub", ["three", "four"]), ("my texts", ["one", "two", "three", "four"])]


def test_a_missing_set_is_skipped_unless_it_is_a_fitting_corpus(monkeypatch):
    """skip_missing (the command line's default sets) leaves out a scored set whose files are missing, never a
    fitting corpus's: that fails, before anything is embedded."""
    sets = _small_sets(monkeypatch)

    def load(name, **kwargs):
        if name == "sickr":
            raise FileNotFoundError("SICK not found")
        return sets[name]

    monkeypatch.setattr("skflow.evaluation.load_sts", load)
    _HashedEncoder.calls.clear()
    with pytest.raises(FileNotFoundError, match="SICK not found"):
        evaluate(_HashedEncoder(), methods=["center"], sets=["stsb", "sickr"], fit_on=["sickr-train"],
                 skip_missing=True)
    assert _HashedEncoder.calls == []
    results = evaluate(_HashedEncoder(), methods=["center"], sets=["stsb", "sickr"], fit_on=["stsb-train"],
                       skip_missing=True)
    assert list(results["sets"]) == ["stsb"] and results["skipped"] == {"sickr": "SICK not found"}


def test_none_keeps_its_codes_fitted_on_the_set_whatever_the_corpora(monkeypatch):
    """fit_on without target: the raw row stays (once), its int8 ranges fitted on the set's own sentences (as the
    docstring says); the other rows' on the fitting corpus."""
    sets = _small_sets(monkeypatch)
    encoder = _HashedEncoder()
    results = evaluate(encoder, methods=["none", "center"], sets=["stsb"], fit_on=["stsb-train"],
                       precisions=["float32", "int8"])["sets"]["stsb"]
    assert list(results) == ["none", "none/int8", "center@stsb-train", "center@stsb-train/int8"]
    stsb = sets["stsb"]
    test = encoder.transform(stsb.pairs[stsb.subsets == "test"])
    for fitted_on, row in [(stsb.pairs, "none/int8"), (stsb.pairs[stsb.subsets == "train"], "center@stsb-train/int8")]:
        fitted = encoder.transform(fitted_on.ravel())
        method = make_method("center").fit(fitted) if row.startswith("center") else None
        mapped, latent = (fitted, test) if method is None else (method.transform(fitted), method.transform(test))
        codes = Quantizer(precision="int8").fit(mapped)
        expected = sts_report(codes.inverse_transform(codes.transform(latent)), stsb.scores[stsb.subsets == "test"],
                              stsb.subsets[stsb.subsets == "test"])
        assert results[row]["wmean"] == pytest.approx(expected["wmean"]), row


def test_read_texts_reads_texts_as_embed_does_and_only_them(tmp_path, monkeypatch):
    """A BOM and CRLF line ends dropped, blank lines skipped, compressed files, a folder in name order; of a Parquet
    file the text column only (its other columns, images or vectors, are never read); a null: one line naming it."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from skflow.distributed import InputError, read_texts

    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "b.txt").write_bytes(b"\xef\xbb\xbfA man plays.\r\n\r\n  \r\nA dog runs.\r\n")
    (tmp_path / "texts" / "a.txt.gz").write_bytes(gzip.compress("Ein Hund läuft.\n".encode()))
    assert read_texts([tmp_path / "texts"]) == ["Ein Hund läuft.", "A man plays.", "A dog runs."]
    pq.write_table(pa.table({"id": [1, 2], "image": [b"\x00" * 1000] * 2, "text": ["a", "b"]}), tmp_path / "t.parquet")
    read = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *args, columns=None, **kwargs: read.append(columns) or real(
        *args, columns=columns, **kwargs))
    assert read_texts([tmp_path / "t.parquet"]) == ["a", "b"] and read == [["text"]]
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "null.parquet")
    with pytest.raises(InputError, match=r"null.parquet: row 2 of column 'text' is empty \(null\), not a string$"):
        read_texts([tmp_path / "null.parquet"])


@pytest.mark.parametrize("precisions, mapped", [(["float32"], []), (["float32", "int8"], [(50, 8), (50, 8)])])
def test_a_fitting_corpus_is_mapped_through_a_method_only_where_codes_are_fitted_on_it(precisions, mapped,
                                                                                        monkeypatch):
    """The user's corpus mapped (and held) again for each method only where int8 or binary ranges are fitted on it:
    once for each encoder setting (STS-B's and SciFact's), never in float32."""
    _small_sets(monkeypatch)
    _SpyWhitener.transformed.clear()
    monkeypatch.setattr("skflow.evaluation.make_method", lambda name, **kw: None if name == "none" else _SpyWhitener())
    mine = [f"a text of mine, number {i}" for i in range(50)]
    results = evaluate(_HashedEncoder(), methods=["whiten"], sets=["scifact", "stsb", "sts16"],
                       fit_on=[("mine", mine)], precisions=precisions)
    assert [shape for shape in _SpyWhitener.transformed if shape[0] == 50] == mapped
    assert list(results["sets"]["sts16"])[0] == "whiten@mine" and "whiten@mine" in results["retrieval"]["scifact"]

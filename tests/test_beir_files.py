"""BEIR files from elsewhere (issue #46, items 3 and 8-12), tried as an attacker or a careless user would: memory
bounded while parsing, texts and every known split digested, lone surrogates, pseudo-files, FIFOs and links named for
what they are, archives and options named as the user knows them."""

import dataclasses
import io
import json
import os
import shutil
import threading
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from skflow.cli import main
from skflow.datasets import BEIRDataError, STSDataError, command_line_words, load_beir, load_sts
from skflow.datasets import _beir as beir
from skflow.datasets import _beir_files as beir_files
from skflow.datasets import _files as files

HEADER = "query-id\tcorpus-id\tscore"


def _folder(folder: Path, corpus: str | None = None, queries: str | None = None, qrels: str | None = None) -> Path:
    """A BEIR folder of 3 documents, 2 queries and 3 judgements; each file replaceable."""
    (folder / "qrels").mkdir(parents=True)
    texts = {"corpus.jsonl": corpus, "queries.jsonl": queries, "qrels/test.tsv": qrels}
    defaults = {"corpus.jsonl": "".join(json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}) + "\n"
                                        for i in (1, 2, 3)),
                "queries.jsonl": '{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "second"}\n',
                "qrels/test.tsv": f"{HEADER}\nq1\td1\t1\nq1\td2\t2\nq2\td3\t1\n"}
    for name, text in texts.items():
        (folder / name).write_text(defaults[name] if text is None else text, encoding="utf-8")
    return folder


def _within(seconds: float, function, *args, **kwargs):
    """``function``'s result or exception, run in a thread: a read that blocks on a FIFO fails the test, not hangs."""
    outcome = []

    def run():
        try:
            outcome.append(function(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{function.__name__} blocked for {seconds} s"
    return outcome[0]


def _peak(function, *args, **kwargs) -> tuple[object, int]:
    """``function``'s result (or exception) and the peak bytes Python allocated during it (tracemalloc)."""
    tracemalloc.start()
    try:
        outcome = function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        outcome = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, peak


# --------------------------------------------------------------------------------- memory (#46 item 3)
@pytest.mark.slow
def test_parsing_a_corpus_of_real_abstracts_peaks_below_three_times_its_file(scifact, tmp_path):
    """SciFact's abstracts tiled to 24 MiB with new ids: the parse held about 3x the file before (every line as bytes,
    as text and as a record at once; a planted 150 MiB corpus of tiny records peaked at 2.92 GiB); line by line, it
    holds what it returns (the texts, and the documents as embedded: 2.5x) and one line."""
    folder = _folder(tmp_path / "tiled")
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as corpus:
        size, i = 0, 0
        while size < 24 << 20:
            j = i % len(scifact.texts)
            size += corpus.write(json.dumps({"_id": f"d{i}", "title": scifact.titles[j], "text": scifact.texts[j]})
                                 + "\n")
            i += 1
    data, peak = _peak(load_beir, folder)
    assert len(data.corpus) == i == 16_257 and data.corpus[5183 + 7] == scifact.corpus[7]
    assert 2.0 * size < peak < 3.0 * size, peak / size  # measured: 2.51x (the texts twice: texts and documents)


@pytest.mark.slow
@pytest.mark.parametrize("crafted", ["tiny records", "a 4-byte character in each text"])
def test_records_that_would_hold_more_than_the_bound_are_refused_before_holding_it(tmp_path, monkeypatch, crafted):
    """What parsing holds is counted as it grows: files that hold 5-8x their size in Python objects (tiny records;
    an astral character makes Python store a whole text in 4 bytes a character, twice) stop at HELD_LIMIT (here
    lowered to 3x the file), naming the line, never holding more."""
    folder = _folder(tmp_path / "crafted")
    record, n = ({"text": "ab"}, 30_000) if crafted == "tiny records" else \
        ({"title": "t", "text": "x" * 200 + "\U0001f600"}, 8_000)  # the text held twice: as itself, and with its title
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as corpus:
        size = sum(corpus.write(json.dumps({"_id": f"d{i}", **record}, ensure_ascii=False) + "\n") for i in range(n))
    monkeypatch.setattr(beir_files, "HELD_LIMIT", 3 * size)
    refused, peak = _peak(load_beir, folder)
    assert isinstance(refused, BEIRDataError), refused
    assert str(refused).startswith(f"{folder / 'corpus.jsonl'}:")
    assert f" of memory, more than the {3 * size / 2**20:.1f} MiB that load_beir holds: too many records for their " \
        "size, or text that Python stores in 2 or 4 bytes a character" in str(refused)
    assert 1000 < int(str(refused).split(":")[1]) < n  # part way, where the count passed the bound
    assert peak < 3 * size + (1 << 20), peak / size
    monkeypatch.setattr(beir_files, "HELD_LIMIT", 10 * size)
    data, peak = _peak(load_beir, folder)
    assert len(data.corpus) == n
    assert 5 * size < peak < 10 * size  # measured: tiny records 6.7x, the 4-byte character 7.9x


def test_a_line_or_file_past_its_bound_is_refused_at_that_line(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "long", corpus=json.dumps({"_id": "d1", "text": "x" * 5000}) + "\n"
                     + json.dumps({"_id": "d2", "text": "short"}) + "\n")
    monkeypatch.setattr(files, "LINE_LIMIT", 1000)
    with pytest.raises(BEIRDataError, match=r"corpus\.jsonl:1: a line longer than 1,000 bytes: not a line of"):
        load_beir(folder)
    monkeypatch.setattr(files, "LINE_LIMIT", 10_000)
    monkeypatch.setattr(beir_files, "BEIR_LIMIT", 1000)
    with pytest.raises(BEIRDataError, match=r"corpus\.jsonl: larger than 1,000 bytes; replace it with the file"):
        load_beir(folder)


# ---------------------------------------------------------------- what "verified" covers (#46 item 8)
@pytest.fixture
def scifact_copy(scifact, tmp_path) -> Path:
    """A data home holding a copy of the shared SciFact folder (verified as it is)."""
    source = Path(scifact.DESCR.split("read from ")[1].split(" (")[0])
    shutil.copytree(source, tmp_path / "home" / "scifact")
    return tmp_path / "home"


def _rewrite(path: Path, change) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("".join(json.dumps(change(json.loads(line)), ensure_ascii=True) + "\n" for line in lines))


def test_the_same_rows_in_other_bytes_are_verified_and_other_texts_are_not(scifact_copy):
    """The published rows with other key orders, escapes and an extra key are the published set; every text "x"
    with the published ids and counts (it loaded as verified) is not, nor is one query edited."""
    corpus, queries = scifact_copy / "scifact" / "corpus.jsonl", scifact_copy / "scifact" / "queries.jsonl"
    _rewrite(corpus, lambda record: {"metadata": {}, "text": record["text"], "_id": record["_id"],
                                     "title": record["title"]})  # keys reordered, non-ASCII escaped
    assert "\\u" in corpus.read_text()
    assert load_beir("scifact", data_home=scifact_copy).verified
    original = corpus.read_bytes()
    _rewrite(corpus, lambda record: {**record, "text": "x"})
    with pytest.raises(BEIRDataError, match=r"is not the published one \(the documents' titles or texts are not the "
                                            r"published ones\): a damaged or modified folder\. Delete it"):
        load_beir("scifact", data_home=scifact_copy)
    modified = load_beir("scifact", data_home=scifact_copy, allow_modified=True)
    assert not modified.verified and "NOT verified: a modified folder, read with allow_modified=True" in modified.DESCR
    corpus.write_bytes(original)
    _rewrite(queries, lambda record: {**record, "text": record["text"] + "?"} if record["_id"] == "1" else record)
    with pytest.raises(BEIRDataError, match=r"\(the queries' texts are not the published ones\)"):
        load_beir("scifact", data_home=scifact_copy)


def test_a_split_whose_rows_are_not_known_here_is_not_called_verified(scifact_copy, scifact):
    """A made-up train.tsv with the published counts (919 judgements of 809 queries) loaded as verified."""
    lines = (scifact_copy / "scifact" / "queries.jsonl").read_text().splitlines()
    queries = [json.loads(line)["_id"] for line in lines]
    rows = [f"{q}\t{scifact.corpus_ids[0]}\t1" for q in queries[:809]]
    rows += [f"{q}\t{scifact.corpus_ids[1]}\t1" for q in queries[:110]]
    (scifact_copy / "scifact" / "qrels" / "train.tsv").write_text("\n".join([HEADER, *rows]) + "\n")
    train = load_beir("scifact", "train", data_home=scifact_copy)
    assert sum(len(judged) for judged in train.qrels.values()) == 919 and not train.verified
    assert ("(verified against the published set: its documents and queries, by the sha256 of their ids and texts; "
            "split 'train': its counts (919 judgements of 809 queries), not its rows: no digest of them is known "
            "here)") in train.DESCR
    assert load_beir("scifact", data_home=scifact_copy).verified  # the test split's rows are known


def test_a_corpus_longer_than_the_published_one_is_refused_at_the_first_line_past_it(scifact_copy):
    corpus = scifact_copy / "scifact" / "corpus.jsonl"
    with open(corpus, "a") as file:
        file.write(json.dumps({"_id": "extra", "title": "", "text": "x"}) + "\n")
    with pytest.raises(BEIRDataError, match=rf"not the published one \({corpus} holds more than the 5,183 documents, "
                                            r"at line 5,184\)"):
        load_beir("scifact", data_home=scifact_copy)
    assert len(load_beir("scifact", data_home=scifact_copy, allow_modified=True).corpus) == 5184


# --------------------------------------------------------------------- lone surrogates (#46 item 9)
@pytest.mark.parametrize("where", ["corpus text", "corpus title", "query text", "id"])
def test_a_lone_surrogate_escape_is_one_error_naming_file_and_line(tmp_path, where):
    """``"\\ud800"`` is valid JSON, not a character: it loaded, then evaluate died in the tokenizer (10 frames)."""
    bad = '"x \\ud800 y"'
    documents = ['{"_id": "d1", "text": "t"}', '{"_id": "d2", "text": "t"}', '{"_id": "d3", "text": "t"}']
    queries = ['{"_id": "q1", "text": "first"}', '{"_id": "q2", "text": "second"}']
    if where == "corpus text":
        documents[1] = '{"_id": "d2", "text": %s}' % bad
    elif where == "corpus title":
        documents[1] = '{"_id": "d2", "title": %s, "text": "t"}' % bad
    elif where == "query text":
        queries[1] = '{"_id": "q2", "text": %s}' % bad
    else:
        documents[1] = '{"_id": "d\\udfff", "text": "t"}'
    folder = _folder(tmp_path / "f", corpus="\n".join(documents) + "\n", queries="\n".join(queries) + "\n")
    file = "queries.jsonl" if where == "query text" else "corpus.jsonl"
    key, escape = {"corpus text": ("text", "d800"), "corpus title": ("title", "d800"), "query text": ("text", "d800"),
                   "id": ("_id", "dfff")}[where]
    with pytest.raises(BEIRDataError) as refused:
        load_beir(folder)
    assert str(refused.value) == (f"{folder / file}:2: {key!r} holds the escape \\u{escape}, a lone UTF-16 surrogate "
                                  "that is not a character (a pair cut in two?)")
    # an escaped pair is one character: it loads
    _folder(tmp_path / "pair", corpus='{"_id": "d1", "text": "a \\ud83d\\ude00"}\n{"_id": "d2", "text": "t"}\n'
            '{"_id": "d3", "text": "t"}\n')
    assert load_beir(tmp_path / "pair").texts[0] == "a \U0001f600"


# ------------------------------------------------------- pseudo-files, FIFOs and links (#46 items 10, 11)
def test_a_file_linked_to_proc_self_environ_is_refused_unread_and_nothing_of_it_is_shown(tmp_path, monkeypatch):
    """qrels/test.tsv -> /proc/self/environ was read, and the header's error showed its first 80 characters: the
    process's environment, credentials included."""
    monkeypatch.setenv("SKFLOW_TEST_SECRET", "AKIA-not-a-real-key-1234")
    folder = _folder(tmp_path / "planted")
    (folder / "qrels" / "test.tsv").unlink()
    (folder / "qrels" / "test.tsv").symlink_to("/proc/self/environ")
    refused = _within(10, load_beir, folder)
    assert isinstance(refused, BEIRDataError)
    assert str(refused) == (f"{folder / 'qrels' / 'test.tsv'} is a link to /proc/self/environ, which is a pseudo-file "
                            "of /proc, not a file. A folder in BEIR's layout holds " + beir._LAYOUT + ".")
    (folder / "corpus.jsonl").unlink()
    (folder / "corpus.jsonl").symlink_to("/sys/kernel/mm/transparent_hugepage/enabled"
                                         if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
                                         else "/proc/self/status")
    assert "which is a pseudo-file of /" in str(_within(10, load_beir, folder))
    # a regular file of secrets is read, but a header that is not BEIR's is not shown
    (folder / "qrels" / "test.tsv").unlink()
    (folder / "qrels" / "test.tsv").write_text("SKFLOW_TEST_SECRET=AKIA-not-a-real-key-1234\n")
    (folder / "corpus.jsonl").unlink()
    _folder(tmp_path / "good")
    shutil.copy(tmp_path / "good" / "corpus.jsonl", folder / "corpus.jsonl")
    refused = _within(10, load_beir, folder)
    assert "AKIA" not in str(refused) and "SKFLOW_TEST_SECRET" not in str(refused)
    assert str(refused).endswith("test.tsv:1: expected the header line 'query-id\\tcorpus-id\\tscore' (the line "
                                 "differs from it at column 1)")


def test_a_link_to_an_open_file_of_the_process_through_proc_or_dev_is_refused_unread(tmp_path):
    """/proc/self/fd/N and /dev/stdin are the kernel's links to the files the process has open: a file of secrets
    redirected to stdin, or opened by the program, lies on a disk, and was read through a planted link."""
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{HEADER}\nSKFLOW_TEST_SECRET=AKIA-not-a-real-key-1234\n")
    folder = _folder(tmp_path / "planted")
    qrels = folder / "qrels" / "test.tsv"
    with open(secret) as stream:
        for target, root in ((f"/proc/self/fd/{stream.fileno()}", "/proc"), (f"/dev/fd/{stream.fileno()}", None)):
            if root is None and not os.path.exists(target):
                continue
            qrels.unlink()
            qrels.symlink_to(target)
            refused = _within(10, load_beir, folder)
            assert isinstance(refused, BEIRDataError), refused
            assert str(refused).startswith(f"{qrels} is a link to {target}, which is a pseudo-file of "), refused
            assert "AKIA" not in str(refused)
        # a link of links into /proc, and a link to a folder of links
        (tmp_path / "hop").symlink_to(f"/proc/self/fd/{stream.fileno()}")
        qrels.unlink()
        qrels.symlink_to(tmp_path / "hop")
        assert "which is a pseudo-file of /proc, not a file" in str(_within(10, load_beir, folder))
        (tmp_path / "fds").symlink_to("/proc/self/fd")
        qrels.unlink()
        qrels.symlink_to(tmp_path / "fds" / str(stream.fileno()))
        assert "which is a pseudo-file of /proc, not a file" in str(_within(10, load_beir, folder))
    # a link to a link to a regular file is read
    qrels.unlink()
    (tmp_path / "real.tsv").write_text(f"{HEADER}\nq1\td1\t1\n")
    (tmp_path / "hop2").symlink_to(tmp_path / "real.tsv")
    qrels.symlink_to(tmp_path / "hop2")
    assert load_beir(folder).qrels == {"q1": {"d1": 1}}


def test_a_link_switched_to_a_pseudo_file_after_its_check_is_refused_by_the_open_file(tmp_path, monkeypatch):
    link = tmp_path / "data.tsv"
    link.symlink_to("/proc/self/environ")
    monkeypatch.setattr(files, "what_it_is", lambda path: None)  # as if it were a regular file when looked at
    with pytest.raises(BEIRDataError, match=r"data\.tsv: a pseudo-file of /proc, not a data file; do this$"):
        files.read_data(link, 1000, BEIRDataError, "do this")


def _plant(path: Path, kind: str, tmp_path: Path) -> str:
    """``path`` made into ``kind``; returns what the error must say it is."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO (named pipe)"
    if kind == "device link":
        path.symlink_to("/dev/null")
        return "a link to /dev/null, which is a device"
    if kind == "folder":
        path.mkdir()
        return "a folder"
    path.symlink_to(tmp_path / "nowhere")
    return f"a link to {tmp_path / 'nowhere'}, which is missing (a dangling link)"


@pytest.mark.parametrize("kind", ["fifo", "device link", "folder", "dangling link"])
@pytest.mark.parametrize("file", ["corpus.jsonl", "qrels/test.tsv"])
def test_a_file_that_is_not_a_file_is_named_for_what_it_is_not_as_missing(tmp_path, kind, file, monkeypatch):
    """A FIFO, a link to a device, a folder or a dangling link was refused as missing ("lacks corpus.jsonl; delete the
    folder to download it again"). Never read, never blocked on, never completed by a download."""
    home = tmp_path / "home"
    folder = _folder(home / "scifact")
    what = _plant(folder / file, kind, tmp_path)
    monkeypatch.setattr(beir, "download", lambda *args, **kwargs: pytest.fail("downloaded"))
    refused = _within(10, load_beir, "scifact", data_home=home, allow_modified=True)
    assert isinstance(refused, BEIRDataError), refused
    assert str(refused) == (f"BEIR set 'scifact': {folder / file} is {what}, not a file. Delete the folder to download "
                            "it again, or put the files there in BEIR's layout.")
    refused = _within(10, load_beir, folder)  # by its path
    assert str(refused).startswith(f"{folder / file} is {what}, not a file. A folder in BEIR's layout holds")
    (folder / "queries.jsonl").unlink()  # both at once: what is missing and what is not a file
    refused = _within(10, load_beir, folder)
    assert isinstance(refused, BEIRDataError)
    assert str(refused).startswith(f"{folder} lacks queries.jsonl; {folder / file} is {what}, not a file.")


def test_a_sets_folder_that_is_a_file_or_a_dangling_link_is_named_and_never_downloaded_over(tmp_path, monkeypatch):
    monkeypatch.setattr(beir, "download", lambda *args, **kwargs: pytest.fail("downloaded"))
    (tmp_path / "scifact").write_text("x")
    with pytest.raises(BEIRDataError, match=r"^BEIR set 'scifact': .*/scifact is a file, not a folder; delete it to "
                                            r"download the set again\.$"):
        load_beir("scifact", data_home=tmp_path)
    (tmp_path / "scifact").unlink()
    (tmp_path / "scifact").symlink_to(tmp_path / "nowhere")
    with pytest.raises(BEIRDataError, match=r"/scifact is a link to .*/nowhere, which is missing \(a dangling link\), "
                                            r"not a folder"):
        load_beir("scifact", data_home=tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "dangling link"])
def test_an_sts_file_that_is_not_a_file_is_named_and_never_replaced_by_a_download(tmp_path, kind, monkeypatch):
    folder = tmp_path / "SICK"
    folder.mkdir()
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (folder / name).write_text("x\n")
    what = _plant(folder / "SICK_test_annotated.txt", kind, tmp_path)
    monkeypatch.setattr("skflow.datasets._sts.download", lambda *args, **kwargs: pytest.fail("downloaded"))
    refused = _within(10, load_sts, "sickr", split="test", data_home=tmp_path)
    assert isinstance(refused, STSDataError)
    assert str(refused) == (f"STS set 'sickr': {folder / 'SICK_test_annotated.txt'} is {what}, not a file. Delete it "
                            "to download it again, or put the file there.")


# ------------------------------------------------------------- the words the user typed (#46 item 12)
def _serve(monkeypatch, tmp_path: Path, members: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    archive = tmp_path / "served" / "scifact.zip"
    archive.parent.mkdir()
    archive.write_bytes(buffer.getvalue())
    monkeypatch.setitem(beir._SETS, "scifact", dataclasses.replace(beir._SETS["scifact"], urls=(archive.as_uri(),)))


def test_an_archive_is_reported_by_its_members_never_by_the_hidden_folder_it_is_extracted_to(tmp_path, monkeypatch):
    small = _folder(tmp_path / "small")
    members = {f"scifact/{name}": (small / name).read_bytes() for name in ("corpus.jsonl", "queries.jsonl",
                                                                            "qrels/test.tsv")}
    _serve(monkeypatch, tmp_path, members)  # no qrels/train.tsv
    with pytest.raises(FileNotFoundError) as refused:
        load_beir("scifact", data_home=tmp_path / "home")
    assert "ValueError: the archive has no scifact/qrels/train.tsv." in str(refused.value)
    assert "/attempt/" not in str(refused.value) and ".skflow-tmp-" not in str(refused.value)
    shutil.rmtree(tmp_path / "served")
    members["scifact/qrels/train.tsv"] = members["scifact/qrels/test.tsv"]
    members["scifact/corpus.jsonl"] = members["scifact/corpus.jsonl"] + b'{"_id": "d4", "text": \n'
    _serve(monkeypatch, tmp_path, members)
    with pytest.raises(FileNotFoundError) as refused:
        load_beir("scifact", data_home=tmp_path / "home")
    assert "BEIRDataError: scifact/corpus.jsonl:4: not a JSON line (Expecting value" in str(refused.value)
    assert list((tmp_path / "home").iterdir()) == []


def test_messages_name_python_arguments_in_python_and_options_on_the_command_line(scifact_copy, tmp_path, capsys,
                                                                                 monkeypatch):
    """The command line's --no-download was reported as download_if_missing=False."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for name in ("scifact", "sickr"):
        kind = "BEIR" if name == "scifact" else "STS"
        load = load_beir if name == "scifact" else load_sts
        with pytest.raises(FileNotFoundError) as python:
            load(name, data_home=empty, download_if_missing=False)
        assert f"{kind} set {name!r} is not available: not downloaded, with download_if_missing=False." \
            in str(python.value)
        assert "The data folder is the data_home argument, else" in str(python.value)
        with command_line_words(), pytest.raises(FileNotFoundError) as words:
            load(name, data_home=empty, download_if_missing=False)
        assert str(words.value) == str(python.value).replace("download_if_missing=False", "--no-download").replace(
            "the data_home argument", "--data-home")
        assert main(["evaluate", "--sets", name, "--data-home", str(empty), "--no-download", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not downloaded, with --no-download. " in err and "--data-home, else" in err
        assert "download_if_missing" not in err and "data_home" not in err
    _rewrite(scifact_copy / "scifact" / "corpus.jsonl", lambda record: {**record, "text": "x"})
    with pytest.raises(BEIRDataError, match=r"or pass allow_modified=True to use a modified copy on purpose\.$"):
        load_beir("scifact", data_home=scifact_copy)
    monkeypatch.setattr("skflow.embedding._encoding.encode_ids", lambda *a, **k: pytest.fail("embedded"))
    assert main(["evaluate", "--sets", "scifact", "--data-home", str(scifact_copy), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("or pass --allow-modified-data to use a modified copy on purpose.\n") and "allow_modified" \
        not in err

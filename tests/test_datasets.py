"""load_sts: exact counts on the original files, the SICK format, download and its failures."""

import io
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sts_downloads import serve, zip_bytes

from skflow.datasets import STS_SETS, get_data_home, load_sts
from skflow.datasets import _sts as datasets

COUNTS = {
    "sts12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    "sts13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "sts14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    "sts15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    "sts16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244, "question-question": 209},
    "stsb": {"train": 5749, "dev": 1500, "test": 1379},
}
TOTALS = {"sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000, "sts16": 1186, "stsb": 8628}


@pytest.mark.parametrize("name", list(COUNTS))
def test_exact_counts_per_subset(sts_data_home, name):
    data = load_sts(name, data_home=sts_data_home, download_if_missing=False)
    assert Counter(data.subsets.tolist()) == COUNTS[name]
    assert data.pairs.shape == (TOTALS[name], 2) and data.scores.shape == (TOTALS[name],)
    assert data.scores.min() == 0.0 and data.scores.max() == 5.0
    texts = data.pairs.ravel()
    assert all(isinstance(t, str) and t and t == t.strip() and "\t" not in t for t in texts)
    assert f"{TOTALS[name]} sentence pairs" in data.DESCR and "Licence:" in data.DESCR


@pytest.mark.parametrize("split, n", [("train", 5749), ("dev", 1500), ("test", 1379)])
def test_stsb_splits(sts_data_home, split, n):
    data = load_sts("stsb", split=split, data_home=sts_data_home, download_if_missing=False)
    assert len(data.scores) == n and set(data.subsets) == {split}
    pairs, scores = load_sts("stsb", split=split, data_home=sts_data_home, return_X_y=True)
    np.testing.assert_array_equal(pairs, data.pairs)
    np.testing.assert_array_equal(scores, data.scores)


def test_parsed_values(sts_data_home):
    test = load_sts("stsb", split="test", data_home=sts_data_home)
    assert tuple(test.pairs[0]) == ("A girl is styling her hair.", "A girl is brushing her hair.")
    assert test.scores[0] == 2.5
    msrpar = load_sts("sts12", data_home=sts_data_home)
    # line 3 of MSRpar starts with a quote: a csv reader with default quoting would merge rows
    assert msrpar.pairs[2, 0].startswith('"It\'s a huge black eye," said publisher')
    sts16 = load_sts("sts16", data_home=sts_data_home)
    assert not any("stackexchange.com" in t for t in sts16.pairs.ravel())  # source notes dropped


def test_sick_fixture_in_its_exact_format(tmp_path):
    folder = tmp_path / "SICK"
    folder.mkdir()
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    rows = {
        "SICK_train.txt": ["1\tA group of kids is playing in a yard \tA group of boys in a yard is playing\t4.5"
                           "\tNEUTRAL",
                           "2\tA man is cutting a tomato\tA woman is slicing a potato\t2.2\tCONTRADICTION"],
        "SICK_trial.txt": ["4\tThe dog runs\tA dog is running\t4.9\tENTAILMENT"],
        "SICK_test_annotated.txt": ["6\tA cat sleeps\tNobody is sleeping\t1.0\tCONTRADICTION",
                                    "7\tTwo men talk\tTwo people are talking\t4.1\tENTAILMENT",
                                    "9\tA boy jumps\tA child leaps\t3.6\tNEUTRAL"],
    }
    for file, lines in rows.items():
        newline = "\r\n" if file == "SICK_test_annotated.txt" else "\n"
        (folder / file).write_bytes(newline.join([header, *lines, ""]).encode())
    data = load_sts("sickr", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert Counter(data.subsets.tolist()) == {"train": 2, "trial": 1, "test": 3}
    np.testing.assert_array_equal(data.scores, [4.5, 2.2, 4.9, 1.0, 4.1, 3.6])
    assert data.pairs[0, 0] == "A group of kids is playing in a yard"
    test = load_sts("sickr", split="test", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert tuple(test.pairs[2]) == ("A boy jumps", "A child leaps") and test.scores[2] == 3.6
    assert not any("\r" in t for t in test.pairs.ravel())


def test_unscored_lines_are_skipped(tmp_path):
    folder = tmp_path / "STS15-en-test"
    folder.mkdir()
    for subset in [part.label for part in datasets._SETS["sts15"].parts]:
        (folder / f"STS.input.{subset}.txt").write_text("a\tb\nc\td\ne\tf\n")
        (folder / f"STS.gs.{subset}.txt").write_text("1.5\n\n4\n")
    data = load_sts("sts15", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert len(data.scores) == 10
    assert tuple(data.pairs[1]) == ("e", "f") and data.scores[1] == 4.0


def test_bad_names_and_splits():
    with pytest.raises(ValueError, match="valid names are sts12, sts13, sts14, sts15, sts16, stsb, sickr"):
        load_sts("sts17")
    with pytest.raises(ValueError, match="splits train, dev, test; got split='validation'"):
        load_sts("stsb", split="validation")
    assert STS_SETS == ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


def test_data_home_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SKFLOW_DATA", str(tmp_path / "env"))
    assert get_data_home() == tmp_path / "env"
    assert get_data_home(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("SKFLOW_DATA")
    assert get_data_home() == Path.home() / "skflow_data"


def test_missing_files_offline_error(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_sts("sts13", data_home=tmp_path, download_if_missing=False)
    message = str(info.value)
    assert "STS13-en-test/STS.input.FNWN.txt" in message and str(tmp_path) in message
    assert "STS2013-en-test.zip" in message and "SKFLOW_DATA" in message


# ----------------------------------------------------------------- download
def _archive_of(sts_data_home, folder, inner, rename=lambda n: n) -> dict[str, bytes]:
    return {f"{inner}/{rename(p.name)}": p.read_bytes() for p in sorted((sts_data_home / folder).iterdir())}


def test_download_extracts_and_verifies(sts_data_home, tmp_path, monkeypatch):
    url12 = datasets._SETS["sts12"].archives[0].urls[0]
    members = _archive_of(sts_data_home, "STS12-en-test", "test-gold")
    members["test-gold/STS.output.MSRpar.txt"] = b"ignored sample output"
    url16 = datasets._SETS["sts16"].archives[0].urls[0]
    stsb_url = datasets._SETS["stsb"].archives[0].urls[0]
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w:gz") as tf:
        tf.add(sts_data_home / "STSBenchmark", arcname="stsbenchmark")
    fetched = serve(monkeypatch, {
        url12: zip_bytes(members),
        url16: zip_bytes(_archive_of(sts_data_home, "STS16-en-test", "sts2016-english-with-gs-v1.0",
                                lambda n: n.replace("STS.", "STS2016.", 1))),
        stsb_url: tar_buffer.getvalue(),
    })
    assert len(load_sts("sts12", data_home=tmp_path).scores) == 3108
    assert len(load_sts("sts16", data_home=tmp_path).scores) == 1186
    assert len(load_sts("stsb", split="dev", data_home=tmp_path).scores) == 1500
    assert fetched == [url12, url16, stsb_url]
    load_sts("sts12", data_home=tmp_path)
    assert len(fetched) == 3  # present now: no second download
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STS12-en-test", "STS16-en-test", "STSBenchmark"]


def test_checksum_mismatch_leaves_nothing_behind(sts_data_home, tmp_path, monkeypatch):
    url = datasets._SETS["sts13"].archives[0].urls[0]
    members = _archive_of(sts_data_home, "STS13-en-test", "test-gs")
    members["test-gs/STS.gs.FNWN.txt"] = members["test-gs/STS.gs.FNWN.txt"].replace(b"\n", b"\n\n", 1)
    serve(monkeypatch, {url: zip_bytes(members)})
    with pytest.raises(FileNotFoundError, match="STS.gs.FNWN.txt has sha256"):
        load_sts("sts13", data_home=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_leaves_nothing_behind(tmp_path, monkeypatch):
    """SICK comes in three archives; the second one fails."""
    header = b"pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    first = datasets._SETS["sickr"].archives[0].urls[0]
    serve(monkeypatch, {first: zip_bytes({"SICK_train.txt": header + b"1\ta\tb\t3.0\tNEUTRAL\n"})})
    with pytest.raises(FileNotFoundError, match="the download failed: .*unreachable in this test"):
        load_sts("sickr", data_home=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_partial_folder_is_completed(sts_data_home, tmp_path, monkeypatch):
    shutil.copytree(sts_data_home / "STS14-en-test", tmp_path / "STS14-en-test")
    (tmp_path / "STS14-en-test" / "STS.gs.images.txt").unlink()
    url = datasets._SETS["sts14"].archives[0].urls[0]
    serve(monkeypatch, {url: zip_bytes(_archive_of(sts_data_home, "STS14-en-test", "sts-en-test-gs-2014"))})
    assert len(load_sts("sts14", data_home=tmp_path).scores) == 3750
    assert [p.name for p in tmp_path.iterdir()] == ["STS14-en-test"]


def test_archive_members_cannot_escape(tmp_path, monkeypatch):
    url = datasets._SETS["sts13"].archives[0].urls[0]
    serve(monkeypatch, {url: zip_bytes({"test-gs/../../evil.txt": b"x", "test-gs/sub/evil.txt": b"x"})})
    with pytest.raises(FileNotFoundError, match="do not contain"):
        load_sts("sts13", data_home=tmp_path)
    assert not (tmp_path.parent / "evil.txt").exists() and list(tmp_path.iterdir()) == []

"""STS data that is damaged, modified or in the wrong format; download sources, Zenodo's SICK, a killed download."""

import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sts_downloads import serve, zip_bytes

from skflow.cli import main
from skflow.datasets import _checksums as _sts_checksums
from skflow.datasets import _download as _sts_download
from skflow.datasets import _sts as datasets
from skflow.datasets import load_sts
from skflow.datasets._files import STSDataError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sts13(sts_data_home, tmp_path) -> Path:
    """A private copy of STS13 (1,500 pairs) to damage."""
    shutil.copytree(sts_data_home / "STS13-en-test", tmp_path / "STS13-en-test")
    return tmp_path / "STS13-en-test"


def _cut(path: Path, n_lines: int) -> None:
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:n_lines]))


@pytest.mark.parametrize("damage", ["truncated", "both_cut_at_the_same_line", "cr_only", "crlf", "one_score_edited"])
def test_a_damaged_file_is_an_error_naming_it_never_fewer_pairs(sts13, damage):
    gold, inputs = sts13 / "STS.gs.headlines.txt", sts13 / "STS.input.headlines.txt"
    if damage == "truncated":
        gold.write_bytes(gold.read_bytes()[:1000])
    elif damage == "both_cut_at_the_same_line":
        _cut(gold, 600)
        _cut(inputs, 600)
    elif damage == "cr_only":
        inputs.write_bytes(inputs.read_bytes().replace(b"\n", b"\r"))
    elif damage == "crlf":
        inputs.write_bytes(inputs.read_bytes().replace(b"\n", b"\r\n"))
    else:
        gold.write_bytes(gold.read_bytes().replace(b"4.4", b"1.4", 1))
    message = r"STS.(gs|input).headlines.txt: sha256 [0-9a-f]{64} is not that of the file"
    with pytest.raises(STSDataError, match=message):
        load_sts("sts13", data_home=sts13.parent)
    assert isinstance(STSDataError("x"), ValueError)


def test_a_modified_copy_is_read_only_on_purpose_and_said_so(sts13):
    _cut(sts13 / "STS.gs.headlines.txt", 600)
    _cut(sts13 / "STS.input.headlines.txt", 600)
    data = load_sts("sts13", data_home=sts13.parent, allow_modified=True)
    assert len(data.scores) == 1500 - 150 and "NOT verified" in data.DESCR


@pytest.mark.parametrize(
    "file, content, message",
    [
        ("STS.gs.FNWN.txt", b"", r"STS.gs.FNWN.txt: the file is empty"),
        ("STS.input.FNWN.txt", b"a\tb\nc\td\n\xff\xfe\tx\n",
         r"STS.input.FNWN.txt:3: invalid UTF-8 \(byte 0xff at column 1\)"),
        ("STS.input.FNWN.txt", b"a\tb\rc\td\re\tf\r", r"STS.input.FNWN.txt:1: a carriage return .* CR-only line ends"),
        ("STS.gs.FNWN.txt", b"1\n2\nhigh\n", r"STS.gs.FNWN.txt:3: the score 'high' is not a number"),
        ("STS.gs.FNWN.txt", "1\n٣\n2\n".encode(), r"STS.gs.FNWN.txt:2: the score '٣' is not a number"),
        ("STS.gs.FNWN.txt", b"1\n5.5\n2\n", r"STS.gs.FNWN.txt:2: the score '5.5' is outside \[0, 5\]"),
        ("STS.gs.FNWN.txt", b"nan\n1\n2\n", r"STS.gs.FNWN.txt:1: the score 'nan' is outside \[0, 5\]"),
        ("STS.input.FNWN.txt", b"a\tb\nc d\ne\tf\n",
         r"STS.input.FNWN.txt:2: expected 2 or 4 tab-separated fields, got 1"),
        ("STS.input.FNWN.txt", b"a\tb\nc\td\n", r"STS.input.FNWN.txt has 2 lines but .*STS.gs.FNWN.txt has 3"),
    ],
)
def test_parse_errors_name_the_file_and_the_line(sts13, file, content, message):
    (sts13 / "STS.input.FNWN.txt").write_bytes(b"a\tb\nc\td\ne\tf\n")
    (sts13 / "STS.gs.FNWN.txt").write_bytes(b"1\n2\n3\n")
    (sts13 / file).write_bytes(content)
    with pytest.raises(STSDataError, match=message):
        load_sts("sts13", data_home=sts13.parent, allow_modified=True)


def _sick_folder(home: Path, test_rows: list[str], header: str = _sts_download.SICK_HEADER) -> None:
    folder = home / "SICK"
    folder.mkdir(parents=True)
    for name, rows in {"SICK_train.txt": ["1\ta\tb\t3.5\tNEUTRAL"], "SICK_trial.txt": ["2\tc\td\t1\tNEUTRAL"],
                       "SICK_test_annotated.txt": test_rows}.items():
        (folder / name).write_text("\n".join([header, *rows, ""]))


@pytest.mark.parametrize(
    "rows, header, message",
    [
        (["3\te\tf\t0.5\tNEUTRAL"], None, r"SICK_test_annotated.txt:2: the score '0.5' is outside \[1, 5\]"),
        (["3\te\tf\t4.0"], None, r"SICK_test_annotated.txt:2: expected 5 tab-separated fields, got 4"),
        (["3\te\tf\t4.0\tNEUTRAL"], "id\tA\tB\tscore\tlabel", r"SICK_train.txt:1: expected the header line"),
    ],
)
def test_sick_scores_are_1_to_5_with_five_columns_and_a_header(tmp_path, rows, header, message):
    _sick_folder(tmp_path, rows, header or _sts_download.SICK_HEADER)
    with pytest.raises(STSDataError, match=message):
        load_sts("sickr", data_home=tmp_path, allow_modified=True)


def test_evaluate_on_damaged_data_exits_2_with_one_line_and_no_table(sts13, capsys):
    (sts13 / "STS.gs.OnWN.txt").write_bytes((sts13 / "STS.gs.OnWN.txt").read_bytes()[:-200])
    code = main(["evaluate", "--sets", "sts13", "--method", "none", "--data-home", str(sts13.parent),
                 "--output", str(sts13.parent / "r"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "STS.gs.OnWN.txt: sha256" in err and "--allow-modified-data" in err


# ------------------------------------------------------------------ sources
def test_sources_are_https_first_then_http_then_the_internet_archive_each_verified(sts_data_home, tmp_path,
                                                                                   monkeypatch):
    urls = datasets._SETS["sts13"].archives[0].urls
    assert urls == (
        "https://ixa2.si.ehu.eus/stswiki/images/2/2f/STS2013-en-test.zip",
        "http://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip",
        "https://web.archive.org/web/2020id_/http://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip",
    )
    assert all(a.urls[0].startswith("https://") for info in datasets._SETS.values() for a in info.archives)
    good = {f"test-gs/{p.name}": p.read_bytes() for p in (sts_data_home / "STS13-en-test").iterdir()}
    bad = dict(good, **{"test-gs/STS.gs.OnWN.txt": good["test-gs/STS.gs.OnWN.txt"][:-10]})
    fetched = serve(monkeypatch, {urls[1]: zip_bytes(bad), urls[2]: zip_bytes(good)})  # https down, http damaged
    assert len(load_sts("sts13", data_home=tmp_path).scores) == 1500
    assert fetched == list(urls)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STS13-en-test"]


SICK_RELEASE = (
    "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tentailment_AB\tentailment_BA\t"
    "sentence_A_original\tsentence_B_original\tsentence_A_dataset\tsentence_B_dataset\tSemEval_set\r\n"
    "1\tA kid plays\tA boy plays\tNEUTRAL\t4.5\tx\tx\tx\tx\tFLICKR\tFLICKR\tTRAIN\r\n"
    "2\tA dog runs\tA cat sleeps\tNEUTRAL\t1.2\tx\tx\tx\tx\tFLICKR\tFLICKR\tTEST\r\n"
    "3\tA man cooks\tA man is cooking\tENTAILMENT\t4.9\tx\tx\tx\tx\tSEMEVAL\tSEMEVAL\tTRIAL\r\n"
    "4\tTwo men talk\tNobody talks\tCONTRADICTION\t3\tx\tx\tx\tx\tSEMEVAL\tSEMEVAL\tTEST"
)


def test_sick_falls_back_to_its_zenodo_release_verified_and_flagged(tmp_path, monkeypatch):
    release = SICK_RELEASE.encode()
    monkeypatch.setattr(_sts_download, "ZENODO_SICK_TXT_SHA256", hashlib.sha256(release).hexdigest())
    rebuilt = _sts_download.sick_files_from_release(SICK_RELEASE)
    assert rebuilt["SICK_test_annotated.txt"] == (
        f"{_sts_download.SICK_HEADER}\n2\tA dog runs\tA cat sleeps\t1.2\tNEUTRAL\n"
        "4\tTwo men talk\tNobody talks\t3\tCONTRADICTION\n"
    )
    monkeypatch.setattr(_sts_checksums, "ZENODO_SICK_SHA256", {})
    for name, text in rebuilt.items():
        digest = hashlib.sha256(text.encode()).hexdigest()
        monkeypatch.setitem(_sts_checksums.ZENODO_SICK_SHA256, f"SICK/{name}", digest)
    monkeypatch.setattr("skflow.datasets._files.ZENODO_SICK_SHA256", _sts_checksums.ZENODO_SICK_SHA256)
    fetched = serve(monkeypatch, {_sts_download.ZENODO_SICK_URLS[0]: zip_bytes({"SICK/SICK.txt": release})})
    with pytest.warns(UserWarning, match=r"Zenodo release \(9,840 pairs; test 4,906\).*not comparable"):
        data = load_sts("sickr", data_home=tmp_path)
    assert data.subsets.tolist() == ["train", "trial", "test", "test"] and data.scores.tolist() == [4.5, 4.9, 1.2, 3]
    assert "rebuilt from the SICK release on Zenodo" in data.DESCR
    assert fetched[0].startswith("https://alt.qcri.org/") and fetched[-1] == _sts_download.ZENODO_SICK_URLS[0]


def test_a_zenodo_file_with_another_checksum_is_refused(tmp_path, monkeypatch):
    serve(monkeypatch, {url: zip_bytes({"SICK.txt": SICK_RELEASE.encode()}) for url in _sts_download.ZENODO_SICK_URLS})
    with pytest.raises(FileNotFoundError, match="SICK.txt has sha256 [0-9a-f]{64}, expected 1539c2d0"):
        load_sts("sickr", data_home=tmp_path)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- kill test
class _SlowServer(http.server.ThreadingHTTPServer):
    """Serves one archive; with ``stall`` it sends half the body and waits."""

    def __init__(self, body: bytes, stall: bool):
        self.body, self.stall, self.started = body, stall, threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.server.stall else body)
        self.wfile.flush()
        self.server.started.set()
        if self.server.stall:
            time.sleep(30)

    def log_message(self, *args):
        pass


DOWNLOADER = """
import dataclasses, sys
from skflow.datasets import _sts as datasets
from skflow.datasets._download import Archive
info = datasets._SETS["sts13"]
datasets._SETS["sts13"] = dataclasses.replace(info, archives=(Archive((sys.argv[2],), "test-gs"),))
print(len(datasets.load_sts("sts13", data_home=sys.argv[1]).scores))
"""


@pytest.mark.slow
def test_a_download_killed_midway_leaves_no_data_and_the_next_one_completes(sts_data_home, tmp_path):
    members = {f"test-gs/{p.name}": p.read_bytes() for p in (sts_data_home / "STS13-en-test").iterdir()}
    archive = zip_bytes({**members, "test-gs/padding.bin": os.urandom(1 << 20)})  # long enough to stall in
    for stall in (True, False):
        server = _SlowServer(archive, stall)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/STS2013-en-test.zip"
        process = subprocess.Popen([sys.executable, "-c", DOWNLOADER, str(tmp_path), url], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if stall:
            assert server.started.wait(60)
            os.kill(process.pid, signal.SIGKILL)  # mid-transfer, by its own pid
            process.wait(30)
            assert process.returncode == -signal.SIGKILL
            assert not (tmp_path / "STS13-en-test").exists()  # no partial data where load_sts looks
            staged = [p.name for p in tmp_path.iterdir()]
            assert len(staged) == 1 and staged[0].startswith(".skflow-tmp-") and staged[0].endswith("-STS13-en-test")
        else:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            assert out.strip() == "1500"
            assert [p.name for p in tmp_path.iterdir()] == ["STS13-en-test"]  # the killed one's staging removed
        server.shutdown()


def test_a_file_replaced_between_its_check_and_its_read_is_refused(sts13, monkeypatch):
    """A score edited right after the file's sha256 was accepted, before it is parsed (another process replacing it):
    the edited scores were read as the original data, without a word. The bytes parsed must be those checked."""
    real_check = datasets.check_file
    gold = sts13 / "STS.gs.headlines.txt"

    def check_then_replace(path, relative, **kwargs):
        verdict = real_check(path, relative, **kwargs)
        if path == gold:
            replacement = gold.with_name("replacement")
            replacement.write_bytes(gold.read_bytes().replace(b"4.4", b"1.4", 1))
            os.replace(replacement, gold)
        return verdict

    monkeypatch.setattr(datasets, "check_file", check_then_replace)
    with pytest.raises(STSDataError, match=r"STS.gs.headlines.txt: changed since its sha256 was checked"):
        load_sts("sts13", data_home=sts13.parent)

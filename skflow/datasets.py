"""The STS evaluation sets of BERT-flow: STS12-16, STS-B and SICK-R.

Parsers read the organisers' original files; missing files are downloaded from
the canonical URLs (the ones SentEval uses), checked and extracted atomically.
"""

import hashlib
import io
import os
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

from skflow._sts_checksums import SHA256

__all__ = ["STS_SETS", "get_data_home", "load_sts"]

_STS_SITE = "http://ixa2.si.ehu.es/stswiki/images"
_SICK_SITE = "http://alt.qcri.org/semeval2014/task1/data/uploads"


@dataclass(frozen=True)
class _Archive:
    url: str
    inner: str  # folder inside the archive holding the files
    rename: tuple[tuple[str, str], ...] = ()  # (prefix in archive, prefix on disk)


@dataclass(frozen=True)
class _Part:
    """A block of pairs: one subset of an STS12-16 set, or one split of STS-B and SICK-R."""

    label: str  # what ``load_sts(...).subsets`` says for its pairs
    split: str
    files: tuple[str, ...]  # in the set's folder, in the order its parser takes them


@dataclass(frozen=True)
class _SetInfo:
    title: str
    folder: str
    parts: tuple[_Part, ...]
    parse: Callable[..., tuple[list, list]]  # the parts' files -> (pairs, scores)
    archives: tuple[_Archive, ...]
    licence: str

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(part.split for part in self.parts))

    def files(self, splits: tuple[str, ...]) -> list[str]:
        """The files of these splits, relative to the data home."""
        return [f"{self.folder}/{f}" for part in self.parts if part.split in splits for f in part.files]


def _semeval_set(title: str, folder: str, subsets: tuple[str, ...], archive: _Archive, licence: str) -> _SetInfo:
    """An STS12-16 test set: one input file and one gold file per subset."""
    parts = tuple(_Part(s, "test", (f"STS.input.{s}.txt", f"STS.gs.{s}.txt")) for s in subsets)
    return _SetInfo(title, folder, parts, _parse_semeval, (archive,), licence)


def _split_set(title: str, folder: str, files: dict, parse, archives: tuple[_Archive, ...], licence: str) -> _SetInfo:
    """A set with one file per split (STS-B, SICK-R)."""
    parts = tuple(_Part(split, split, (name,)) for split, name in files.items())
    return _SetInfo(title, folder, parts, parse, archives, licence)


# ------------------------------------------------------------------ parsers
def _lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file, split on ``\\n`` only, ``\\r`` stripped, no final empty line."""
    text = path.read_bytes().decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _parse_semeval(input_path: Path, gold_path: Path) -> tuple[list, list]:
    """``s1 \\t s2 [\\t notes ...]`` lines scored by the same line of the gold file; empty gold = unscored."""
    inputs, golds = _lines(input_path), _lines(gold_path)
    if len(inputs) != len(golds):
        raise ValueError(f"{input_path.name} has {len(inputs)} lines but {gold_path.name} has {len(golds)}.")
    pairs, scores = [], []
    for number, (line, gold) in enumerate(zip(inputs, golds), start=1):
        if not gold.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise ValueError(f"{input_path}:{number}: expected two tab-separated sentences.")
        pairs.append((fields[0].strip(), fields[1].strip()))
        scores.append(float(gold))
    return pairs, scores


def _parse_stsb(path: Path) -> tuple[list, list]:
    """``genre \\t file \\t year \\t id \\t score \\t s1 \\t s2 [\\t source1 \\t source2]``, no header."""
    pairs, scores = [], []
    for number, line in enumerate(_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) < 7:
            raise ValueError(f"{path}:{number}: expected at least 7 tab-separated fields, got {len(fields)}.")
        pairs.append((fields[5].strip(), fields[6].strip()))
        scores.append(float(fields[4]))
    return pairs, scores


def _parse_sick(path: Path) -> tuple[list, list]:
    """Header, then ``pair_ID \\t sentence_A \\t sentence_B \\t relatedness_score \\t entailment``."""
    lines = _lines(path)
    if not lines or not lines[0].startswith("pair_ID"):
        raise ValueError(f"{path}: expected a header line starting with 'pair_ID'.")
    pairs, scores = [], []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) < 4:
            raise ValueError(f"{path}:{number}: expected at least 4 tab-separated fields, got {len(fields)}.")
        pairs.append((fields[1].strip(), fields[2].strip()))
        scores.append(float(fields[3]))
    return pairs, scores


_SETS = {
    "sts12": _semeval_set(
        "SemEval-2012 Task 6 (STS12), English test sets",
        "STS12-en-test",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
        _Archive(f"{_STS_SITE}/4/40/STS2012-en-test.zip", "test-gold"),
        "MSRpar/MSRvid under Microsoft Research licence terms; see 00-readme.txt.",
    ),
    "sts13": _semeval_set(
        "*SEM 2013 shared task (STS13), English test sets (the licensed SMT subset is not distributed)",
        "STS13-en-test",
        ("FNWN", "headlines", "OnWN"),
        _Archive(f"{_STS_SITE}/2/2f/STS2013-en-test.zip", "test-gs"),
        "See 00-readme.txt.",
    ),
    "sts14": _semeval_set(
        "SemEval-2014 Task 10 (STS14), English test sets",
        "STS14-en-test",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
        _Archive(f"{_STS_SITE}/8/8c/STS2014-en-test.zip", "sts-en-test-gs-2014"),
        "images CC BY-SA; see 00-readme.txt.",
    ),
    "sts15": _semeval_set(
        "SemEval-2015 Task 2 (STS15), English test sets",
        "STS15-en-test",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
        _Archive(f"{_STS_SITE}/d/da/STS2015-en-test.zip", "test_evaluation_task2a"),
        "answers-forums is Stack Exchange content, CC BY-SA 3.0 with attribution.",
    ),
    "sts16": _semeval_set(
        "SemEval-2016 Task 1 (STS16), English test sets",
        "STS16-en-test",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
        _Archive(
            f"{_STS_SITE}/9/98/STS2016-en-test.zip",
            "sts2016-english-with-gs-v1.0",
            (("STS2016.input.", "STS.input."), ("STS2016.gs.", "STS.gs.")),
        ),
        "Stack Exchange CC BY-SA 3.0; plagiarism CC BY-NC-SA 2.0 UK; see LICENSE.txt.",
    ),
    "stsb": _split_set(
        "STS Benchmark (Cer et al., 2017)",
        "STSBenchmark",
        {split: f"sts-{split}.csv" for split in ("train", "dev", "test")},
        _parse_stsb,
        (_Archive(f"{_STS_SITE}/4/48/Stsbenchmark.tar.gz", "stsbenchmark"),),
        "Scores CC BY-SA 4.0; each text source keeps its own licence (LICENSE.txt).",
    ),
    "sickr": _split_set(
        "SICK relatedness (SemEval-2014 Task 1; Marelli et al., 2014)",
        "SICK",
        {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"},
        _parse_sick,
        tuple(_Archive(f"{_SICK_SITE}/sick_{split}.zip", "") for split in ("train", "trial", "test_annotated")),
        "CC BY-NC-SA 3.0 Unported, University of Trento.",
    ),
}

STS_SETS = tuple(_SETS)


def get_data_home(data_home: str | os.PathLike | None = None) -> Path:
    """The folder of the STS sets: ``data_home``, else ``$SKFLOW_DATA``, else ``~/skflow_data``.

    Parameters
    ----------
    data_home : str or path-like, default=None

    Returns
    -------
    data_home : pathlib.Path
        The folder; it is not created.
    """
    if data_home is None:
        data_home = os.environ.get("SKFLOW_DATA", Path("~") / "skflow_data")
    return Path(data_home).expanduser()


def load_sts(
    name: str,
    *,
    split: str | None = None,
    data_home: str | os.PathLike | None = None,
    download_if_missing: bool = True,
    return_X_y: bool = False,
) -> Bunch | tuple[np.ndarray, np.ndarray]:
    """Load an STS set: sentence pairs with gold similarity scores.

    Parameters
    ----------
    name : {"sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"}
        The set. STS12-16 are the SemEval test sets with their subsets;
        ``"stsb"`` is the STS Benchmark and ``"sickr"`` SICK relatedness.
    split : str, default=None
        ``"train"``, ``"dev"`` or ``"test"`` for STS-B; ``"train"``,
        ``"trial"`` or ``"test"`` for SICK-R; ``"test"`` (the only one) for
        STS12-16. None loads every split, in that order.
    data_home : str or path-like, default=None
        Where the files are, or are downloaded to. Default: the
        ``SKFLOW_DATA`` environment variable, else ``~/skflow_data``. The
        layout is SentEval's: ``STS12-en-test/``, ..., ``STSBenchmark/``,
        ``SICK/``.
    download_if_missing : bool, default=True
        Download missing files from the organisers' sites. If False, or if
        the download fails, missing files raise :class:`FileNotFoundError`.
    return_X_y : bool, default=False
        Return ``(pairs, scores)`` instead of a Bunch.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``pairs``: ndarray of shape (n_pairs, 2), the two texts (str objects);
        ``scores``: ndarray of shape (n_pairs,), gold scores (0-5 for STS,
        1-5 for SICK-R); ``subsets``: ndarray of shape (n_pairs,), the
        subset of each pair (the split name for STS-B and SICK-R);
        ``DESCR``: a description. Pairs without a gold score are skipped.
    (pairs, scores) : tuple of ndarrays
        With ``return_X_y=True``.

    Examples
    --------
    >>> from skflow.datasets import load_sts
    >>> sts = load_sts("stsb", split="test")
    >>> sts.pairs.shape, sts.scores.shape
    ((1379, 2), (1379,))
    >>> sts12 = load_sts("sts12")
    >>> len(sts12.scores), sorted(set(sts12.subsets))[:2]
    (3108, ['MSRpar', 'MSRvid'])
    """
    if name not in _SETS:
        raise ValueError(f"Unknown STS set {name!r}; valid names are {', '.join(STS_SETS)}.")
    info = _SETS[name]
    if split is not None and split not in info.splits:
        raise ValueError(f"{name!r} has the splits {', '.join(info.splits)}; got split={split!r}.")
    home = get_data_home(data_home)
    splits = info.splits if split is None else (split,)
    files = info.files(splits)
    missing = [f for f in files if not (home / f).is_file()]
    if missing:
        if not download_if_missing:
            raise FileNotFoundError(_missing_message(name, info, home, missing, "download_if_missing=False"))
        try:
            _download(info, home)
        except (OSError, ValueError, zipfile.BadZipFile, tarfile.TarError) as exc:
            raise FileNotFoundError(
                _missing_message(name, info, home, missing, f"the download failed: {exc}")
            ) from exc

    pairs, scores, subsets = [], [], []
    for part in info.parts:
        if part.split in splits:
            p, y = info.parse(*(home / info.folder / f for f in part.files))
            pairs += p
            scores += y
            subsets += [part.label] * len(y)

    pair_array = np.empty((len(pairs), 2), dtype=object)
    pair_array[:] = pairs
    if return_X_y:
        return pair_array, np.asarray(scores, dtype=np.float64)
    counts = {s: subsets.count(s) for s in dict.fromkeys(subsets)}
    descr = (
        f"{info.title}\n\n{len(pairs)} sentence pairs with gold scores "
        f"({', '.join(f'{k} {v}' for k, v in counts.items())}), read from {home / info.folder}.\n"
        f"Licence: {info.licence}"
    )
    return Bunch(
        pairs=pair_array,
        scores=np.asarray(scores, dtype=np.float64),
        subsets=np.asarray(subsets, dtype=object),
        DESCR=descr,
    )


# ----------------------------------------------------------------- download
def _missing_message(name: str, info: _SetInfo, home: Path, missing: list[str], why: str) -> str:
    urls = " ".join(a.url for a in info.archives)
    inner = info.archives[0].inner
    extract = f"the files of its folder {inner}/" if inner else "its files"
    return (
        f"STS set {name!r} is not available: {why}. Missing under {home}: {', '.join(missing)}. "
        f"The data folder is the data_home argument, else $SKFLOW_DATA, else ~/skflow_data. "
        f"To provide the files, download {urls} where there is network access and extract "
        f"{extract} into {home / info.folder}/, or point SKFLOW_DATA at a folder that holds {info.folder}/."
    )


def _download(info: _SetInfo, home: Path) -> None:
    """Fetch, check and move the set's files into place; on failure nothing is left behind."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / info.folder
    with tempfile.TemporaryDirectory(dir=home, prefix=f".{info.folder}-download-") as tmp:
        staging = Path(tmp) / info.folder
        staging.mkdir()
        for archive in info.archives:
            _extract(_fetch(archive.url), archive, staging)
        _verify(info, staging)
        if not target.exists():
            os.replace(staging, target)  # atomic: the folder appears complete or not at all
            return
        for path in sorted(staging.iterdir()):  # a partial folder: fill it file by file, each atomically
            if path.is_file():
                os.replace(path, target / path.name)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def _extract(data: bytes, archive: _Archive, staging: Path) -> None:
    prefix = f"{archive.inner}/" if archive.inner else ""
    if archive.url.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = [(m.filename, lambda m=m: zf.read(m)) for m in zf.infolist() if not m.is_dir()]
            _write_members(members, prefix, archive, staging)
    else:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            members = [(m.name, lambda m=m: tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]
            _write_members(members, prefix, archive, staging)


def _write_members(members, prefix: str, archive: _Archive, staging: Path) -> None:
    for member_name, read in members:
        if not member_name.startswith(prefix):
            continue
        relative = member_name[len(prefix) :]
        if not relative or "/" in relative or relative.startswith("."):
            continue  # only the files directly in the data folder; never write outside staging
        for old, new in archive.rename:
            if relative.startswith(old):
                relative = new + relative[len(old) :]
        (staging / relative).write_bytes(read())


def _verify(info: _SetInfo, staging: Path) -> None:
    for relative in info.files(info.splits):
        path = staging.parent / relative
        if not path.is_file():
            raise ValueError(f"the downloaded archive does not contain {Path(relative).name}")
        expected = SHA256.get(relative)
        if expected is not None:
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
            if actual != expected:
                raise ValueError(f"{relative} has sha256 {actual}, expected {expected}")


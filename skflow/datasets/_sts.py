"""The STS evaluation sets of BERT-flow: STS12-16, STS-B and SICK-R.

Parsers read the organisers' original files, after checking their sha256;
missing files are downloaded (https first, then mirrors), checked and moved
into place atomically.
"""

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.utils import Bunch

from skflow.datasets._checksums import SHA256
from skflow.datasets._download import Archive, download, mirrored, zenodo_sick
from skflow.datasets._files import STSDataError, check_file, option, parse_semeval, parse_sick, parse_stsb, what_it_is

__all__ = ["STS_SETS", "STSDataError", "get_data_home", "load_sts"]

_STS_SITE = "http://ixa2.si.ehu.es/stswiki/images"
_SICK_SITE = "http://alt.qcri.org/semeval2014/task1/data/uploads"


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
    archives: tuple[Archive, ...]
    licence: str
    fallback: Callable[[Path], None] | None = None  # another release of the whole set, see skflow.datasets._download

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(part.split for part in self.parts))

    def files(self, splits: tuple[str, ...]) -> list[str]:
        """The files of these splits, relative to the data home."""
        return [f"{self.folder}/{f}" for part in self.parts if part.split in splits for f in part.files]


def _semeval_set(title: str, folder: str, subsets: tuple[str, ...], archive: Archive, licence: str) -> _SetInfo:
    """An STS12-16 test set: one input file and one gold file per subset."""
    parts = tuple(_Part(s, "test", (f"STS.input.{s}.txt", f"STS.gs.{s}.txt")) for s in subsets)
    return _SetInfo(title, folder, parts, parse_semeval, (archive,), licence)


def _split_set(title: str, folder: str, files: dict, parse, archives: tuple[Archive, ...], licence: str,
               fallback=None) -> _SetInfo:
    """A set with one file per split (STS-B, SICK-R)."""
    parts = tuple(_Part(split, split, (name,)) for split, name in files.items())
    return _SetInfo(title, folder, parts, parse, archives, licence, fallback)


_SETS = {
    "sts12": _semeval_set(
        "SemEval-2012 Task 6 (STS12), English test sets",
        "STS12-en-test",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
        Archive(mirrored(f"{_STS_SITE}/4/40/STS2012-en-test.zip"), "test-gold"),
        "MSRpar/MSRvid under Microsoft Research licence terms; see 00-readme.txt.",
    ),
    "sts13": _semeval_set(
        "*SEM 2013 shared task (STS13), English test sets (the licensed SMT subset is not distributed)",
        "STS13-en-test",
        ("FNWN", "headlines", "OnWN"),
        Archive(mirrored(f"{_STS_SITE}/2/2f/STS2013-en-test.zip"), "test-gs"),
        "See 00-readme.txt.",
    ),
    "sts14": _semeval_set(
        "SemEval-2014 Task 10 (STS14), English test sets",
        "STS14-en-test",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
        Archive(mirrored(f"{_STS_SITE}/8/8c/STS2014-en-test.zip"), "sts-en-test-gs-2014"),
        "images CC BY-SA; see 00-readme.txt.",
    ),
    "sts15": _semeval_set(
        "SemEval-2015 Task 2 (STS15), English test sets",
        "STS15-en-test",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
        Archive(mirrored(f"{_STS_SITE}/d/da/STS2015-en-test.zip"), "test_evaluation_task2a"),
        "answers-forums is Stack Exchange content, CC BY-SA 3.0 with attribution.",
    ),
    "sts16": _semeval_set(
        "SemEval-2016 Task 1 (STS16), English test sets",
        "STS16-en-test",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
        Archive(
            mirrored(f"{_STS_SITE}/9/98/STS2016-en-test.zip"),
            "sts2016-english-with-gs-v1.0",
            (("STS2016.input.", "STS.input."), ("STS2016.gs.", "STS.gs.")),
        ),
        "Stack Exchange CC BY-SA 3.0; plagiarism CC BY-NC-SA 2.0 UK; see LICENSE.txt.",
    ),
    "stsb": _split_set(
        "STS Benchmark (Cer et al., 2017)",
        "STSBenchmark",
        {split: f"sts-{split}.csv" for split in ("train", "dev", "test")},
        parse_stsb,
        (Archive(mirrored(f"{_STS_SITE}/4/48/Stsbenchmark.tar.gz"), "stsbenchmark"),),
        "Scores CC BY-SA 4.0; each text source keeps its own licence (LICENSE.txt).",
    ),
    "sickr": _split_set(
        "SICK relatedness (SemEval-2014 Task 1; Marelli et al., 2014)",
        "SICK",
        {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"},
        parse_sick,
        tuple(
            Archive(mirrored(f"{_SICK_SITE}/sick_{split}.zip"), "") for split in ("train", "trial", "test_annotated")
        ),
        "CC BY-NC-SA 3.0 Unported, University of Trento.",
        fallback=zenodo_sick,
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
    allow_modified: bool = False,
) -> Bunch | tuple[np.ndarray, np.ndarray]:
    """Load an STS set: sentence pairs with gold similarity scores.

    Every file read is first checked against the sha256 of the file as
    distributed (once per process while it is unchanged), so a truncated,
    cut or converted file is an error, never a set with fewer pairs. Parse
    errors name the file and the line.

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
        Download missing files: from the organisers' sites over https, else
        from the Internet Archive's copies of the same archives (SICK: then
        from its release on Zenodo, see Notes). Every download is checked
        against the sha256 above. If False, or if every source fails, missing
        files raise :class:`FileNotFoundError`.
    return_X_y : bool, default=False
        Return ``(pairs, scores)`` instead of a Bunch.
    allow_modified : bool, default=False
        Read files whose sha256 differs from the distributed file's: your own
        modified copy, on purpose. They are still parsed strictly, and the
        description says that they were not verified.

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

    Raises
    ------
    STSDataError
        A file is damaged or modified (and ``allow_modified`` is False), or
        is not in its set's format: empty, invalid UTF-8, CR-only line ends,
        a wrong number of fields, a score that is not a number or lies
        outside the set's range (0-5; SICK 1-5). A subclass of ValueError.

    Notes
    -----
    The SICK release on Zenodo (record 2787612) has 9,840 pairs, not the
    9,927 of the SemEval 2014 files that SentEval and BERT-flow use (test:
    4,906 pairs, not 4,927). Files rebuilt from it are recognised by their
    own checksums and load with a ``UserWarning``: their scores are not
    comparable with published SICK-R results.

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
    found = {f: what_it_is(home / f) for f in files}
    if others := [f"{home / f} is {what}, not a file" for f, what in found.items() if what not in (None, "missing")]:
        raise STSDataError(f"STS set {name!r}: {'; '.join(others)}. Delete it to download it again, or put the file "
                           "there.")  # never replaced by a download: skflow did not write it
    missing = [f for f, what in found.items() if what == "missing"]
    if missing:
        if not download_if_missing:
            raise FileNotFoundError(_missing_message(name, info, home, missing, "not downloaded, with "
                                                     f"{option('download_if_missing=False')}"))
        expected = {Path(f).name: SHA256.get(f) for f in info.files(info.splits)}
        try:
            download(info.folder, info.archives, expected, home, info.fallback)
        except OSError as exc:
            raise FileNotFoundError(
                _missing_message(name, info, home, missing, f"the download failed: {exc}")
            ) from exc
    verdicts = {check_file(home / f, f, allow_modified=allow_modified) for f in files}
    if "zenodo" in verdicts:
        warnings.warn(
            f"{home / info.folder} holds SICK rebuilt from its Zenodo release (9,840 pairs; test 4,906), not the "
            "SemEval 2014 files (9,927 pairs; test 4,927) that SentEval and BERT-flow use: SICK-R scores on it are "
            "not comparable with published ones.",
            UserWarning,
            stacklevel=2,
        )

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
    provenance = {
        "original": "sha256-verified files as distributed",
        "zenodo": "rebuilt from the SICK release on Zenodo, sha256-verified",
        "modified": "NOT verified: modified files, read with allow_modified=True",
    }
    descr = (
        f"{info.title}\n\n{len(pairs)} sentence pairs with gold scores "
        f"({', '.join(f'{k} {v}' for k, v in counts.items())}), read from {home / info.folder} "
        f"({'; '.join(provenance[v] for v in sorted(verdicts))}).\n"
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
    urls = " ".join(a.urls[0] for a in info.archives)
    inner = info.archives[0].inner
    extract = f"the files of its folder {inner}/" if inner else "its files"
    return (
        f"STS set {name!r} is not available: {why}. Missing under {home}: {', '.join(missing)}. "
        f"The data folder is {option('the data_home argument')}, else $SKFLOW_DATA, else ~/skflow_data. "
        f"To provide the files, download {urls} where there is network access and extract "
        f"{extract} into {home / info.folder}/, or point SKFLOW_DATA at a folder that holds {info.folder}/."
    )

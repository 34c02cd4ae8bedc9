"""skflow embed | fit | transform from and to ``s3://``, against a real S3 API: moto's server on this machine.

The server runs in a thread of the test process (``AWS_ENDPOINT_URL`` points at it, which pyarrow reads); the
credentials are a recognisable secret that must appear in no output, error, log or written object. Ray is the
session's head of 2 CPUs (``tests/conftest.py``), started with the same variables so that its workers read the same
endpoint and credentials; the real command runs ``python -m skflow`` in a process of its own, with a timeout.
"""

import io
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import skflow
from skflow import BertEmbedder, FlowGaussianizer, distributed
from skflow.cli import main
from skflow.ray_jobs import MARKER, OutputFolder, _outputs, input_files, load_model, locate, save_model
from tests.conftest import S3_KEY_ID as KEY_ID
from tests.conftest import S3_SECRET as SECRET
from tests.test_output_files import write_like_ray

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "skflow-corpus"
TOPICS = ["cats", "rain", "trains", "bread"] * 10
SENTENCES = [f"Sentence number {i} is about {topic}." for i, topic in enumerate(TOPICS)]


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def s3(s3_server):
    """The session's moto S3 server emptied, its variables set here, and a boto3 client; the bucket holds the corpus.
    (The session's Ray head, ``ray_instance``, was started with the same variables: its workers read them.)"""
    endpoint = s3_server["AWS_ENDPOINT_URL"]
    # moto keeps its buckets in the process: a module started after another would see the other's objects
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30):
        pass
    with pytest.MonkeyPatch.context() as mp:
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
            mp.delenv(key, raising=False)
        for key, value in s3_server.items():
            mp.setenv(key, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        half = len(SENTENCES) // 2
        for part, rows in enumerate([range(0, half), range(half, len(SENTENCES))]):
            table = pa.table({"id": list(rows), "text": [SENTENCES[i] for i in rows]})
            _put(client, f"corpus/part-{part}.parquet", table)
        client.put_object(Bucket=BUCKET, Key="texts/b.txt", Body="\n".join(SENTENCES[20:]).encode())
        yield client, endpoint


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started before the checks"))


@pytest.fixture(autouse=True)
def no_secret_in_output(capfd):
    """Whatever a test prints never holds the secret (what Ray's workers print is in its logs, checked last)."""
    yield
    out, err = capfd.readouterr()
    assert SECRET not in out + err
    sys.stdout.write(out)
    sys.stderr.write(err)


# ------------------------------------------------------------------------------------- helpers
def _put(client, key: str, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    client.put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())


def _keys(client, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _objects(client, prefix: str) -> dict[str, bytes]:
    """The objects under ``prefix`` and their bytes (folder placeholders, ``name/``, left out)."""
    return {k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in _keys(client, prefix)
            if not k.endswith("/")}


def _s3_table(uri: str) -> pa.Table:
    """The Parquet shards that the manifest of an s3 output lists (how a reader should read one)."""
    remote = locate(uri)
    with remote.filesystem.open_input_stream(remote.child(MARKER).path) as f:
        files = json.loads(f.read())["files"]
    return pa.concat_tables(pq.read_table(remote.child(name).path, filesystem=remote.filesystem) for name in files)


def _sorted_vectors(table: pa.Table, column: str) -> tuple[list, np.ndarray]:
    order = np.argsort(table.column("id").to_numpy())
    vectors = np.stack(table.column(column).to_numpy(zero_copy_only=False)).astype(np.float32)
    return table.column("id").to_numpy()[order].tolist(), vectors[order]


def _embed_args(*args) -> list[str]:
    return ["embed", *map(str, args), "--pooling", "cls", "--dtype", "float32", "--quiet"]


def _refused(capfd, argv, code=2, *, after_ray=False) -> str:
    """The one-line error of a refused command; ``after_ray``: its last line, after what Ray logged."""
    try:
        got = main([str(a) for a in argv])
    except SystemExit as exc:
        got = exc.code
    out, err = capfd.readouterr()
    assert got == code, err
    assert SECRET not in err + out
    err = err.strip().splitlines()[-1] if after_ray else err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _embedder():
    return BertEmbedder(pooling="cls", dtype="float32", show_progress_bar=False)


# --------------------------------------------------------------------------- the three steps on S3
def test_the_workers_import_this_tree(ray_instance, s3):
    @ray.remote
    def where():
        import skflow as imported

        return imported.__file__, os.environ.get("AWS_ENDPOINT_URL")

    assert ray.get(where.remote(), timeout=120) == (skflow.__file__, os.environ["AWS_ENDPOINT_URL"])


def test_embed_fit_transform_on_s3_give_the_vectors_of_local_files(ray_instance, s3, tmp_path):
    client, _ = s3
    local = tmp_path / "corpus"
    local.mkdir()
    for key, data in _objects(client, "corpus/").items():
        (local / key.split("/")[-1]).write_bytes(data)
    # one text per encoder batch: Ray hands the actor both files at once or one at a time, as it goes, and
    # padding to another batch's longest text moves float32 vectors by ~1e-6
    one = ["--batch-size", 1]
    assert main(_embed_args(local, "--output", tmp_path / "emb", *one)) == 0
    assert main(_embed_args(f"s3://{BUCKET}/corpus/", "--output", f"s3://{BUCKET}/emb/", *one)) == 0
    ids, local_vectors = _sorted_vectors(pq.read_table(tmp_path / "emb"), "embedding")
    s3_ids, s3_vectors = _sorted_vectors(_s3_table(f"s3://{BUCKET}/emb"), "embedding")
    assert ids == s3_ids == list(range(40)) and s3_vectors.shape == (40, 384)
    np.testing.assert_array_equal(s3_vectors, local_vectors)  # the same bytes in, the same vectors out

    assert main(["fit", f"s3://{BUCKET}/emb", "--output", f"s3://{BUCKET}/models/flow.skops", "--epochs", "2",
                 "--quiet"]) == 0
    (tmp_path / "flow.skops").write_bytes(client.get_object(Bucket=BUCKET, Key="models/flow.skops")["Body"].read())
    flow = skflow.load(tmp_path / "flow.skops")
    assert isinstance(flow, FlowGaussianizer) and flow.n_samples_seen_ == 80

    assert main(["transform", f"s3://{BUCKET}/emb/", "--model", f"s3://{BUCKET}/models/flow.skops",
                 "--output", f"s3://{BUCKET}/z", "--quiet"]) == 0
    assert main(["transform", str(tmp_path / "emb"), "--model", str(tmp_path / "flow.skops"),
                 "--output", str(tmp_path / "z"), "--quiet"]) == 0
    z_ids, z_s3 = _sorted_vectors(_s3_table(f"s3://{BUCKET}/z"), "z")
    _, z_local = _sorted_vectors(pq.read_table(tmp_path / "z"), "z")
    assert z_ids == ids
    np.testing.assert_array_equal(z_s3, z_local)
    np.testing.assert_allclose(z_s3, flow.transform(local_vectors), rtol=1e-5, atol=1e-5)
    # Nothing but the outputs' manifests and the files they list (no probe, nothing staged), and the model.
    for output in ("emb", "z"):
        listed = json.loads(client.get_object(Bucket=BUCKET, Key=f"{output}/{MARKER}")["Body"].read())["files"]
        assert sorted(_objects(client, f"{output}/")) == sorted(f"{output}/{n}" for n in [MARKER, *listed])
    assert list(_objects(client, "models/")) == ["models/flow.skops"]


def test_local_and_s3_inputs_mix_and_a_transform_reads_the_model_from_s3(ray_instance, s3, tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(SENTENCES[:20]) + "\n", encoding="utf-8")
    out = f"s3://{BUCKET}/mixed"
    assert distributed.embed([tmp_path / "a.txt", f"s3://{BUCKET}/texts/b.txt"], out, embedder=_embedder(),
                             quiet=True) == 40
    table = _s3_table(out)
    assert sorted(table.column("text").to_pylist()) == sorted(SENTENCES)
    np.testing.assert_allclose(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)),
                               _embedder().transform(table.column("text").to_pylist()), rtol=0, atol=1e-5)


class FailingEmbedder(BertEmbedder):
    """Loads like any embedder (its warm-up passes), then fails on the first real batch."""

    def transform(self, X):
        if len(X) > 1:
            raise RuntimeError("the encoder broke on batch 1")
        return super().transform(X)


def test_a_failed_job_leaves_the_old_s3_output_whole_and_nothing_that_looks_complete(ray_instance, s3):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    client, _ = s3
    before = _objects(client, "")
    with pytest.raises(distributed.JobFailedError, match="the encoder broke on batch 1"):
        distributed.embed([f"s3://{BUCKET}/corpus"], f"s3://{BUCKET}/emb", embedder=FailingEmbedder(pooling="cls"),
                          overwrite=True, quiet=True)
    assert _objects(client, "") == before


def test_a_manifest_that_cannot_be_written_leaves_the_old_output_or_nothing(s3, monkeypatch):
    client, _ = s3
    write_like_ray(OutputFolder(f"s3://{BUCKET}/commit-old", overwrite=False), pa.table({"id": [9]}))
    before = _objects(client, "commit-old/")

    def store_gone(where, data):
        raise OSError("the store went away")

    monkeypatch.setattr(_outputs, "write_bytes", store_gone)
    for uri, overwrite in ((f"s3://{BUCKET}/commit-new", False), (f"s3://{BUCKET}/commit-old", True)):
        with pytest.raises(distributed.JobFailedError, match=f"{uri}: the manifest could not be written \\(the store "
                           "went away\\); nothing was written"):
            write_like_ray(OutputFolder(uri, overwrite=overwrite), pa.table({"id": [1, 2, 3]}))
    assert _objects(client, "commit-new") == {} and _objects(client, "commit-old/") == before


_UPLOAD = """
import sys
import numpy as np
from skflow.ray_jobs import save_model
save_model(np.random.default_rng(0).bytes(40 << 20), sys.argv[1])  # 40 MiB: a multipart upload of 4 or more parts
"""


def test_a_model_upload_killed_midway_or_failing_leaves_the_old_model(s3, monkeypatch, tmp_path):
    """SIGKILL (by its pid) a process uploading a model over an old one once its multipart upload has begun."""
    import signal
    import time

    client, _ = s3
    X = np.random.RandomState(0).normal(size=(64, 4)).astype(np.float32)
    save_model(FlowGaussianizer(max_epochs=1, random_state=0).fit(X), f"s3://{BUCKET}/m/flow.joblib")
    before = _objects(client, "m/")
    uploader = subprocess.Popen([sys.executable, "-c", _UPLOAD, f"s3://{BUCKET}/m/flow.joblib"],
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads") and time.monotonic() < end:
            assert uploader.poll() is None, uploader.stderr.read()[-2000:]
            time.sleep(0.01)
    finally:
        os.kill(uploader.pid, signal.SIGKILL)
        uploader.wait(timeout=30)
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "the kill came too late"
    assert _objects(client, "m/") == before
    monkeypatch.setattr("pyarrow.fs.copy_files", lambda *a, **k: (_ for _ in ()).throw(OSError("the store went away")))
    with pytest.raises(OSError, match="writing the model failed, it was not replaced"):
        save_model(FlowGaussianizer(max_epochs=1, random_state=1).fit(X), f"s3://{BUCKET}/m/flow.joblib")
    monkeypatch.undo()
    assert _objects(client, "m/") == before
    assert isinstance(load_model(f"s3://{BUCKET}/m/flow.joblib"), FlowGaussianizer)


# ------------------------------------------------------------------- what is uploaded: moto's request recorder
def _recorder(endpoint: str, action: str) -> str:
    method = "GET" if action == "download-recording" else "POST"
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method=method),
                                timeout=30) as response:
        return response.read().decode()


def _recorded(endpoint: str, run) -> list[dict]:
    """The requests that ``run()`` makes to the store, as moto's recorder keeps them."""
    _recorder(endpoint, "reset-recording")
    _recorder(endpoint, "start-recording")
    try:
        run()
    finally:
        _recorder(endpoint, "stop-recording")
    return [json.loads(line) for line in _recorder(endpoint, "download-recording").splitlines()]


def _uploads(endpoint: str, run) -> tuple[int, int]:
    """``(server-side copies, bytes uploaded)`` of the requests that ``run()`` makes to the store."""
    import base64

    copies = uploaded = 0
    for request in _recorded(endpoint, run):
        headers = {k.lower(): v for k, v in request["headers"].items()}
        copies += "x-amz-copy-source" in headers  # CopyObject and UploadPartCopy
        if request["method"] in ("PUT", "POST"):
            body = request.get("body") or ""
            size = len(base64.b64decode(body)) if request.get("body_encoded") else len(body.encode())
            uploaded += int(headers.get("x-amz-decoded-content-length", size))
    return copies, uploaded


def _downloads(endpoint: str, run, sizes: dict[str, int]) -> int:
    """The bytes of the objects ``sizes`` (key: size) that ``run()`` downloads: each GET of one, its range if it
    has one, else the whole object."""
    import re
    import urllib.parse

    downloaded = 0
    for request in _recorded(endpoint, run):
        url = urllib.parse.urlsplit(request["url"])
        key = urllib.parse.unquote(url.path).lstrip("/").split("/", 1)[-1]  # path-style: /bucket/key
        if request["method"] != "GET" or key not in sizes or url.query:
            continue
        size, headers = sizes[key], {k.lower(): v for k, v in request["headers"].items()}
        if ranged := re.fullmatch(r"bytes=([0-9]+)-([0-9]*)", headers.get("range", "")):
            downloaded += min(int(ranged[2] or size - 1), size - 1) - int(ranged[1]) + 1
        else:
            downloaded += size
    return downloaded


def _size(client, prefix: str) -> int:
    return sum(len(data) for data in _objects(client, prefix).values())


def test_an_s3_output_is_uploaded_once_with_no_server_side_copy(ray_instance, s3, tmp_path, monkeypatch):
    """embed (a first write, then --overwrite) and fit's model file: zero copies, at most 1.3x the bytes."""
    client, endpoint = s3
    monkeypatch.chdir(tmp_path)  # where moto's recorder keeps its file
    out, model = f"s3://{BUCKET}/measured", f"s3://{BUCKET}/measured-model/flow.skops"
    measured = {}
    for what, run in [
        ("embed", lambda: distributed.embed([f"s3://{BUCKET}/corpus"], out, embedder=_embedder(), quiet=True)),
        ("embed --overwrite", lambda: distributed.embed([f"s3://{BUCKET}/corpus"], out, embedder=_embedder(),
                                                        overwrite=True, quiet=True)),
        ("fit", lambda: distributed.fit(out, model, flow=FlowGaussianizer(random_state=0), quiet=True)),
    ]:
        copies, uploaded = _uploads(endpoint, run)
        size = _size(client, "measured-model/" if what == "fit" else "measured/")
        measured[what] = (copies, uploaded, size)
        print(f"{what}: {copies} server-side copies, {uploaded:,} bytes uploaded for an output of {size:,} bytes "
              f"({uploaded / size:.3f}x)")
    assert all(copies == 0 and uploaded <= 1.3 * size for copies, uploaded, size in measured.values()), measured


@pytest.mark.slow
def test_a_text_corpus_on_s3_is_downloaded_once(ray_instance, s3, tmp_path, monkeypatch):
    """embed of three text files (265 kB) on s3://: the driver lists them, the Ray task that reads each file
    checks its rows; at most 1.1x the corpus's bytes are downloaded (the driver read each whole first: 2.0x)."""
    client, endpoint = s3
    monkeypatch.chdir(tmp_path)  # where moto's recorder keeps its file
    sizes = {}
    for part in range(3):
        lines = [" ".join(SENTENCES[i % 30 : i % 30 + 10]) + f" ({part}-{i})\n" for i in range(250)]
        data = "".join(lines).encode()
        client.put_object(Bucket=BUCKET, Key=f"long-texts/part-{part}.txt", Body=data)
        sizes[f"long-texts/part-{part}.txt"] = len(data)
    out = f"s3://{BUCKET}/long-texts-emb"
    run = lambda: distributed.embed([f"s3://{BUCKET}/long-texts/"], out, embedder=_embedder(), quiet=True)  # noqa: E731
    downloaded, corpus = _downloads(endpoint, run, sizes), sum(sizes.values())
    print(f"embed of a text corpus on s3: {downloaded:,} bytes downloaded of a corpus of {corpus:,} bytes "
          f"({downloaded / corpus:.3f}x)")
    assert corpus <= downloaded <= 1.1 * corpus, (downloaded, corpus)
    assert _s3_table(out).num_rows == 750


# ------------------------------------------------------- errors through the command line, in processes of their own
def _command(*argv, env=None, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    run = subprocess.run([sys.executable, "-m", "skflow", *map(str, argv)], capture_output=True, text=True, env=env,
                         timeout=timeout, check=False)
    assert SECRET not in run.stdout + run.stderr
    return run


def _one_line(run) -> str:
    err = run.stderr.strip()
    assert run.returncode == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _auth(endpoint: str, count: str) -> None:
    """moto checks signatures and access keys from now on ("0"), or never again ("inf")."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_a_missing_bucket_a_missing_key_and_bad_credentials_are_one_line_and_exit_2(s3, tmp_path, capfd, no_ray,
                                                                                      monkeypatch):
    client, endpoint = s3
    err = _refused(capfd, ["embed", "s3://skflow-no-such-bucket/corpus/", "--output", tmp_path / "out"])
    assert err == "error: s3://skflow-no-such-bucket/corpus: no such bucket 'skflow-no-such-bucket' " \
                  "(or no access to it)"
    err = _refused(capfd, ["embed", f"s3://{BUCKET}/no-such-key.parquet", "--output", tmp_path / "out"])
    assert err == f"error: s3://{BUCKET}/no-such-key.parquet: no such file or folder"
    (tmp_path / "a.txt").write_text("one text\n", encoding="utf-8")
    assert "no such bucket" in _refused(capfd, ["embed", tmp_path / "a.txt", "--output", "s3://skflow-no-such-bucket/emb"])
    _auth(endpoint, "0")
    try:
        for key in (KEY_ID, "AKIAUNKNOWNKEY000001"):  # a key moto's IAM never issued
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            err = _refused(capfd, ["embed", f"s3://{BUCKET}/corpus/", "--output", tmp_path / "out"])
            assert err.startswith(f"error: s3://{BUCKET}/corpus: cannot be read (") and "AWS Error" in err, err
            assert SECRET not in err
    finally:
        _auth(endpoint, "inf")
    assert not (tmp_path / "out").exists()
    # the real command, in a process of its own: the same line
    run = _command("embed", "s3://skflow-no-such-bucket/corpus/", "--output", tmp_path / "out")
    assert _one_line(run) == "error: s3://skflow-no-such-bucket/corpus: no such bucket 'skflow-no-such-bucket' " \
                             "(or no access to it)"


# --------------------------------------------------------------------- a careless or hostile user, before Ray
def test_outputs_that_are_or_hold_or_lie_in_an_input_uri_are_refused(s3, capfd, no_ray, tmp_path):
    corpus = f"s3://{BUCKET}/corpus"
    for output, what in [(corpus, "is the input"), (corpus + "/", "is the input"), (corpus + "//", "is the input"),
                         (f"{corpus}/out", "lies inside the input"), (f"{corpus}/part-0.parquet", "lies inside"),
                         (f"s3://{BUCKET}/texts/b.txt", "exists and is not a folder")]:
        err = _refused(capfd, _embed_args(corpus + "/", "--output", output, "--overwrite"))
        assert what in err, err
    err = _refused(capfd, _embed_args(f"{corpus}/part-0.parquet", "--output", corpus, "--overwrite"))
    assert err.endswith("contains the input s3://skflow-corpus/corpus/part-0.parquet; choose another output")
    assert "is a whole bucket" in _refused(capfd, _embed_args(corpus, "--output", f"s3://{BUCKET}/"))
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/emb", "--output", f"s3://{BUCKET}/emb/flow.skops", "--quiet"])
    assert "lies inside the input" in err
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/emb", "--model", f"s3://{BUCKET}/models/flow.skops",
                           "--output", f"s3://{BUCKET}/models", "--overwrite", "--quiet"])
    assert "contains the input s3://skflow-corpus/models/flow.skops" in err


def test_file_uris_are_local_paths_under_the_local_rules(capfd, no_ray, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one text\n", encoding="utf-8")
    assert input_files([f"file://{corpus}/"]).files == (str(corpus / "a.txt"),)
    err = _refused(capfd, _embed_args(f"file://{corpus}", "--output", f"file://{corpus}/out"))
    assert err == f"error: {corpus}/out: the output folder lies inside the input {corpus}; choose another output"
    err = _refused(capfd, ["fit", f"file://{corpus}", "--output", f"file://{corpus}/flow.skops", "--quiet"])
    assert err == f"error: {corpus}/a.txt: vectors are read from Parquet shards (as written by skflow embed)"


def test_overwrite_replaces_only_a_prefix_that_skflow_wrote(s3, capfd, no_ray):
    client, _ = s3
    _put(client, "foreign/data.parquet", pa.table({"id": [1]}))
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/corpus", "--output", f"s3://{BUCKET}/foreign"))
    assert "exists and is not empty; pass --overwrite" in err
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/corpus", "--output", f"s3://{BUCKET}/foreign", "--overwrite"))
    assert f"no valid {MARKER} manifest in it" in err
    client.put_object(Bucket=BUCKET, Key=f"foreign/{MARKER}", Body=json.dumps({"files": []}))  # a forged marker
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/corpus", "--output", f"s3://{BUCKET}/foreign/", "--overwrite"))
    assert "holds files that skflow did not write (data.parquet)" in err
    assert sorted(_objects(client, "foreign/")) == ["foreign/.skflow-output", "foreign/data.parquet"]


def test_every_object_of_a_corpus_is_read_or_refused_by_name_whatever_its_key(s3, capfd, no_ray):
    """Keys with a '.', '..' or empty part cannot be read through pyarrow (it normalises them): refused, not
    skipped (they were: 40 of 80 rows embedded, exit 0, no word)."""
    client, _ = s3
    for key, rows in (("odd/a.txt", SENTENCES[:20]), ("odd/b.txt", SENTENCES[20:]), ("odd/./x.txt", SENTENCES[:20]),
                      ("odd/../z.txt", SENTENCES[20:])):
        client.put_object(Bucket=BUCKET, Key=key, Body="\n".join(rows).encode())
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/odd/", "--output", f"s3://{BUCKET}/odd-emb"))
    assert err == (f"error: s3://{BUCKET}/odd: the object '../z.txt' has an empty, '.' or '..' part in its name, "
                   "which cannot be read; rename it or name the files to read")
    for key, shown in (("odd/../z.txt", "./x.txt"), ("odd/./x.txt", "/y.txt")):
        client.delete_object(Bucket=BUCKET, Key=key)
        client.put_object(Bucket=BUCKET, Key="odd//y.txt", Body=b"a text\n")  # pyarrow reads no '//' key either
        assert f"the object '{shown}' has an empty" in _refused(capfd, _embed_args(f"s3://{BUCKET}/odd/", "--output",
                                                                                    f"s3://{BUCKET}/odd-emb"))
    assert "a part of the key is empty, '.' or '..'" in _refused(
        capfd, _embed_args(f"s3://{BUCKET}/odd/./x.txt", "--output", f"s3://{BUCKET}/odd-emb"))
    assert _keys(client, "odd-emb") == []


def test_bad_uris_are_one_line_and_never_repeat_credentials(s3, capfd, no_ray, tmp_path):
    """Credentials or a query string in a URI, an unknown scheme, an invalid bucket: as input, output and model."""
    cases = [
        (f"s3://{KEY_ID}:{SECRET}@{BUCKET}/corpus", "s3://***@skflow-corpus/corpus: a URI must not hold credentials"),
        (f"s3://{BUCKET}/corpus?secret_key={SECRET}&access_key={KEY_ID}",
         "s3://skflow-corpus/corpus: a URI with a query string or fragment is not accepted"),
        ("foo://bucket/corpus", "foo://bucket/corpus: unknown scheme 'foo'"),
        ("s3://Skflow-Corpus/corpus", "s3://Skflow-Corpus/corpus: 'Skflow-Corpus' is not a valid S3 bucket name"),
        ("s3://", "s3://: no bucket or host in the URI"),
    ]
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("one text\n", encoding="utf-8")
    emb = tmp_path / "emb"
    emb.mkdir()
    pq.write_table(pa.table({"embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(8, np.float32)), 4)}),
                   emb / "part-0.parquet")
    for uri, message in cases:
        for argv in (_embed_args(uri, "--output", tmp_path / "out"),  # an input, an output, a model, a model output
                     _embed_args(texts, "--output", uri),
                     ["transform", emb, "--model", uri, "--output", tmp_path / "z", "--quiet"],
                     ["fit", emb, "--output", uri, "--quiet"]):
            err = _refused(capfd, argv)
            expected = (f"--output must name a file, not a folder, got '{uri}'"  # the name's check first
                        if uri == "s3://" and argv[0] == "fit" else message)
            assert err == f"error: {expected}" or err.startswith(f"error: {expected} ") or expected in err, (argv, err)
            assert KEY_ID not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "texts"]
    err = _refused(capfd, _embed_args(texts, "--output", tmp_path / "out", "--model", f"s3://{BUCKET}/encoder"))
    assert err == f"error: --model s3://{BUCKET}/encoder: an encoder on object storage is not supported; copy the " \
                  "model folder to a local path (or give a Hugging Face hub id)"


def test_models_on_s3_are_checked_like_local_ones(s3, capfd, no_ray, tmp_path):
    client, _ = s3
    _put(client, "emb8/part-0.parquet", pa.table({"id": [0, 1], "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(16, np.float32)), 8)}))
    client.put_object(Bucket=BUCKET, Key="prefix/flow.skops/inside", Body=b"x")
    client.put_object(Bucket=BUCKET, Key="notes/flow.joblib", Body=b"not a model")
    z = tmp_path / "z"
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/emb8", "--model", f"s3://{BUCKET}/prefix/flow.skops",
                           "--output", z, "--quiet"])
    assert err == f"error: s3://{BUCKET}/prefix/flow.skops: is a folder; give the model file (.skops or joblib) " \
                  "that skflow fit wrote"
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/emb8", "--model", f"s3://{BUCKET}/models/none.skops",
                           "--output", z, "--quiet"])
    assert err == f"error: s3://{BUCKET}/models/none.skops: no such file or folder"
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/emb8", "--model", f"s3://{BUCKET}/notes/flow.joblib",
                           "--output", z, "--quiet"])
    assert err.startswith(f"error: s3://{BUCKET}/notes/flow.joblib: cannot read the model")
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/emb8", "--output", f"s3://{BUCKET}/prefix/flow.skops", "--quiet"])
    assert "prefix/flow.skops: is a folder; give a file name" in err
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/emb8", "--output", f"s3://{BUCKET}/notes/flow.joblib", "--quiet"])
    assert err.endswith("exists; pass --overwrite to replace it")
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/emb8", "--output", f"s3://{BUCKET}/notes/flow.joblib",
                           "--overwrite", "--quiet"])
    assert "exists and is not a model file (skops or joblib); --overwrite replaces only those" in err
    assert _objects(client, "notes/") == {"notes/flow.joblib": b"not a model"}


def test_a_scheme_that_only_fsspec_knows_is_listed_and_read_the_same_way(no_ray, capfd):
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/skflow-test/corpus/a.txt", "\n".join(SENTENCES[:3]).encode())
    memory.pipe("/skflow-test/corpus/sub/b.txt.gz", __import__("gzip").compress(b"one\ntwo\n"))
    memory.pipe("/skflow-test/corpus/_SUCCESS", b"")
    memory.pipe("/skflow-test/corpus/.hidden/c.txt", b"never read")
    corpus = input_files(["memory://skflow-test/corpus/"])
    assert corpus.kind == "text" and corpus.files == ("memory://skflow-test/corpus/a.txt",
                                                      "memory://skflow-test/corpus/sub/b.txt.gz")
    from skflow.ray_jobs._corpus import read_table  # what the Ray task that reads each file calls

    assert sum(read_table(file).num_rows for file in corpus.files) == 5
    memory.pipe("/skflow-test/corpus/notes.md", b"x")
    err = _refused(capfd, _embed_args("memory://skflow-test/corpus", "--output", "memory://skflow-test/out"))
    assert "1 file(s) in the input folders would not be read: memory://skflow-test/corpus/notes.md" in err


def test_no_log_and_no_written_object_holds_the_secret(ray_instance, s3, tmp_path):
    """Last: Ray's logs of the whole module's jobs, and every object in the bucket."""
    client, _ = s3
    for path in ray_instance.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for key, data in _objects(client, "").items():
        assert SECRET.encode() not in data, key


def test_evaluate_fits_on_texts_on_s3_named_by_their_folder_or_file(s3, monkeypatch, tmp_path):
    """``evaluate --fit-on s3://...``, as docs/transfer.md says: a folder (trailing slash or not) or a file on S3,
    read as embed reads it, its rows named by its last name."""
    given = []

    def stop(embedder, *, fit_on, **kwargs):
        given.extend(fit_on)
        raise ValueError("stopped")

    monkeypatch.setattr("skflow.cli.evaluate", stop)
    assert main(["evaluate", "--sets", "stsb", "--fit-on", f"s3://{BUCKET}/corpus/", f"s3://{BUCKET}/texts/b.txt",
                 "--output", str(tmp_path / "r"), "--quiet"]) == 2
    assert given == [("corpus", SENTENCES), ("b.txt", SENTENCES[20:])]

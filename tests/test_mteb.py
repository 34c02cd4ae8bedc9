"""skflow.mteb: MTEB scores a skflow pipeline as skflow does (SciFact and Cranfield subsets, real embeddings), the
roles' prompts reach the encoder, and what MTEB cannot score is refused in one line before any work."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils import Bunch

from skflow import BertEmbedder, ITQRotation, MeanDirectionRemover, Quantizer, Whitener
from skflow.compression import search
from skflow.datasets import load_beir
from skflow.evaluation import retrieval_report
from skflow.mteb import MTEBEncoder, retrieval_task

ROOT = Path(__file__).resolve().parents[1]
NOWHERE = "/nonexistent/encoder"  # a refusal that loaded the encoder would fail on this instead


def _subset(data: Bunch, queries: list[int], n_other: int) -> Bunch:
    """The given queries, their judged documents and the first ``n_other`` documents, in the set's order."""
    query_ids = [data.query_ids[i] for i in queries]
    judged = {doc for q in query_ids for doc in data.qrels[q]}
    keep = [i for i, doc in enumerate(data.corpus_ids) if doc in judged or i < n_other]
    return Bunch(name=data.name, split=data.split, corpus_ids=[data.corpus_ids[i] for i in keep],
                 titles=[data.titles[i] for i in keep], texts=[data.texts[i] for i in keep],
                 corpus=[data.corpus[i] for i in keep], query_ids=query_ids,
                 queries=[data.queries[i] for i in queries], qrels={q: data.qrels[q] for q in query_ids})


class _Recorder(MTEBEncoder):
    """Keeps the texts MTEB hands over and the vectors it gets back, by role."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = {}

    def encode(self, inputs, **kwargs):
        texts = [text for batch in inputs for text in batch["text"]]
        vectors = super().encode([{"text": texts}], **kwargs)
        self.seen[str(kwargs["prompt_type"].value)] = texts, vectors
        return vectors


def _mteb_ndcg(model, data: Bunch, **kwargs) -> float:
    import mteb

    result = mteb.evaluate(model, retrieval_task(data), cache=None, show_progress_bar=False, **kwargs)
    return result.task_results[0].scores[data.split][0]["ndcg_at_10"]


def _skflow_ndcg(queries, documents, data: Bunch) -> float:
    found = search(queries, documents, k=min(100, len(documents)))
    return retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)["ndcg@10"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> BertEmbedder:
    """The bundled encoder as MTEB runs it, but 32 tokens; one cache for the module's tests, which embed the same
    texts again."""
    return BertEmbedder(pooling="mean", max_length=32, dtype="float32", device="cpu",
                        cache_dir=tmp_path_factory.mktemp("embeddings"))


@pytest.fixture(scope="module")
def scifact_small(scifact) -> Bunch:
    """50 of SciFact's test queries, their judged documents and 150 others: 202 documents."""
    return _subset(scifact, list(range(0, 300, 6)), n_other=150)


@pytest.fixture(scope="module")
def cranfield() -> Bunch:
    home = os.environ.get("SKFLOW_RETRIEVAL_DATA")
    if not home or not (Path(home) / "cranfield").is_dir():
        raise RuntimeError("the tests need the Cranfield folder in $SKFLOW_RETRIEVAL_DATA (BEIR layout)")
    return load_beir(Path(home) / "cranfield")


@pytest.mark.slow
def test_mteb_scores_a_pipeline_as_skflow_does_on_two_corpora(scifact_small, cranfield, embedder):
    # SciFact, the raw encoder (the headline: MTEB's 64.51 on the whole set, docs/mteb.md); MTEB hands the encoder
    # title + " " + text, as load_beir gives the corpus
    small = scifact_small
    assert (len(small.query_ids), len(small.corpus_ids)) == (50, 202)
    model = _Recorder(embedder)
    found = _mteb_ndcg(model, small)
    (queries, Q), (documents, D) = model.seen["query"], model.seen["document"]
    assert documents == small.corpus and queries == small.queries
    assert abs(found - _skflow_ndcg(Q, D, small)) <= 1e-4
    assert 0.6 < found < 0.9  # the judged documents are a quarter of the subset: easier than the whole set

    # Cranfield, a fitted pipeline (rotated centred vectors): MTEB gets what the pipeline gives, and scores it so
    small = _subset(cranfield, list(range(20)), n_other=100)
    assert (len(small.query_ids), len(small.corpus_ids)) == (20, 186)
    pipeline = make_pipeline(embedder, ITQRotation(n_components=64, random_state=0)).fit(small.corpus)
    model = _Recorder(pipeline)
    assert model.name == "skflow/all-MiniLM-L6-v2+ITQRotation"
    found = _mteb_ndcg(model, small)
    (queries, Q), (documents, D) = model.seen["query"], model.seen["document"]
    assert documents == small.corpus and Q.shape == (20, 64)
    np.testing.assert_array_equal(D, pipeline.transform(small.corpus))
    assert abs(found - _skflow_ndcg(Q, D, small)) <= 1e-4
    assert 0.3 < found < 0.8


@pytest.mark.slow
def test_the_roles_prompts_reach_the_encoder_and_change_the_vectors(scifact, embedder):
    import mteb

    small = _subset(scifact, [0, 1, 2, 3, 4, 5], n_other=20)
    remover = MeanDirectionRemover().fit(embedder.transform(small.corpus))
    pipeline = make_pipeline(embedder, remover)
    e5 = {"query": "query: ", "document": "passage: "}
    model = _Recorder(pipeline, prompts=e5)
    with_prompts = _mteb_ndcg(model, small)
    assert embedder.prompt is None  # the pipeline's own embedder is left as it was
    Q, D = model.seen["query"][1], model.seen["document"][1]
    prompted = {prompt: clone(embedder).set_params(prompt=prompt) for prompt in ("query: ", "passage: ")}
    np.testing.assert_array_equal(Q, remover.transform(prompted["query: "].transform(small.queries)))
    np.testing.assert_array_equal(D, remover.transform(prompted["passage: "].transform(small.corpus)))
    assert np.abs(Q - remover.transform(embedder.transform(small.queries))).max() > 0.05  # the prompt changes them
    assert abs(with_prompts - _skflow_ndcg(Q, D, small)) <= 1e-4

    # MTEB's precedence: the task's own key first, then the role's; no key: the embedder's own prompt
    task = retrieval_task(small).metadata
    model = MTEBEncoder(pipeline, prompts={**e5, "SciFact-query": "claim: "})
    assert model.prompt(task, mteb.types.PromptType.query) == "claim: "
    assert model.prompt(task, mteb.types.PromptType.document) == "passage: "
    own = MTEBEncoder(BertEmbedder(prompt="text: "), prompts={"query": "query: "})
    assert own.prompt(task, mteb.types.PromptType.document) == "text: "
    assert model.revision != MTEBEncoder(pipeline, prompts=e5).revision != MTEBEncoder(pipeline).revision
    refitted = make_pipeline(embedder, MeanDirectionRemover().fit(embedder.transform(small.queries)))
    assert MTEBEncoder(refitted).revision != MTEBEncoder(pipeline).revision == MTEBEncoder(pipeline).revision


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Estimating quantization parameters")  # MTEB's, from fewer than 10,000 rows
def test_mtebs_compression_wraps_the_encoder_with_its_own_ranges_and_scoring(scifact_small, embedder):
    import mteb

    small = scifact_small
    for dtype, codes in (("binary", lambda X: (X > 0).astype(np.float32)),  # 0/1 vectors, by cosine
                         ("int8", lambda X: np.floor((X - X.min(0)) / ((X.max(0) - X.min(0)) / 255)) - 128)):
        model = _Recorder(embedder)
        found = _mteb_ndcg(mteb.models.CompressionWrapper(model, mteb.types.OutputDType(dtype)), small)
        Q, D = model.seen["query"][1], model.seen["document"][1]  # int8: ranges of the queries, of the documents
        assert abs(found - _skflow_ndcg(codes(Q), codes(D), small)) <= 1e-4, dtype
        assert model.mteb_model_meta.experiment_kwargs == {"output_dtypes": dtype}  # its results kept apart


def test_what_mteb_cannot_score_is_refused_before_any_work():
    unfitted = make_pipeline(BertEmbedder(NOWHERE), Whitener())
    with pytest.raises(ValueError, match=r"^step 'whitener' of the pipeline \(Whitener\) is not fitted: fit the "):
        MTEBEncoder(unfitted)
    rows = np.random.default_rng(0).normal(size=(20, 4))
    codes = make_pipeline(BertEmbedder(NOWHERE), Whitener().fit(rows), Quantizer(precision="int8").fit(rows))
    with pytest.raises(TypeError, match=r"^step 'quantizer' of the pipeline is a Quantizer: its codes are not "
                                        r"vectors MTEB can score by cosine.*CompressionWrapper.*search_stored"):
        MTEBEncoder(codes)
    with pytest.raises(TypeError, match=r"^MTEBEncoder takes a BertEmbedder, or a Pipeline that starts with one; "
                                        r"got a Pipeline that starts with Whitener\.$"):
        MTEBEncoder(make_pipeline(Whitener().fit(rows)))
    with pytest.raises(TypeError, match=r"got Whitener\.$"):
        MTEBEncoder(Whitener().fit(rows))
    with pytest.raises(ValueError, match=r"MTEB calls the documents' role 'document', not 'passage'"):
        MTEBEncoder(BertEmbedder(NOWHERE), prompts={"query": "query: ", "passage": "passage: "})
    with pytest.raises(TypeError, match=r"^prompts must be a dict"):
        MTEBEncoder(BertEmbedder(NOWHERE), prompts="query: ")
    with pytest.raises(ValueError, match=r"^name must be 'organization/model'"):
        MTEBEncoder(BertEmbedder(NOWHERE), name="mine")
    with pytest.raises(TypeError, match=r"^retrieval_task takes what skflow.datasets.load_beir returns; got a "
                                        r"dict without name, split, corpus_ids"):
        retrieval_task({"corpus": ["a"]})


def test_without_mteb_the_adapter_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mteb", None)  # as if not installed: import mteb raises ImportError
    hint = r'pip install "mteb>=2\.26" \(skflow\'s mteb extra\) \('
    with pytest.raises(ImportError, match=r"^MTEBEncoder needs mteb: " + hint):
        MTEBEncoder(BertEmbedder(NOWHERE))
    with pytest.raises(ImportError, match=r"^retrieval_task needs mteb: " + hint):
        retrieval_task(Bunch(name="x", split="test", corpus_ids=["d"], titles=[""], texts=["t"], query_ids=["q"],
                             queries=["q"], qrels={"q": {"d": 1}}))


@pytest.mark.slow
def test_skflow_imports_and_runs_without_mteb():
    code = ("import sys; sys.modules['mteb'] = None; import skflow, skflow.mteb, skflow.evaluation, skflow.cli; "
            "print(skflow.BertEmbedder(max_length=8).transform(['a']).shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 384)"


@pytest.mark.slow
def test_a_last_step_that_gives_no_float_vectors_is_refused_in_one_line(scifact):
    import mteb

    signs = FunctionTransformer(lambda X: (X > 0).astype(np.int8))
    model = MTEBEncoder(make_pipeline(BertEmbedder(max_length=8), signs))
    with pytest.raises(TypeError, match=r"^the pipeline's last step, FunctionTransformer, gives int8 arrays of shape "
                                        r"\(2, 384\) for 2 texts, not one float vector a text"):
        model.encode([{"text": ["a", "b"]}], task_metadata=retrieval_task(scifact).metadata, hf_split="test",
                     hf_subset="default", prompt_type=mteb.types.PromptType.query)

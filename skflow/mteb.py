"""MTEB, the field's own evaluator, on skflow: a fitted pipeline as an MTEB model (:class:`MTEBEncoder`) and a
retrieval set read by :mod:`skflow.datasets` as an MTEB retrieval task (:func:`retrieval_task`); see ``docs/mteb.md``.

Needs mteb (skflow's ``mteb`` extra), imported when an encoder or a task is built: ``import skflow`` never
imports it.
"""

import copy
import functools
import hashlib
import pickle
import uuid
from collections.abc import Mapping

import joblib
import numpy as np
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import Pipeline
from sklearn.utils import Bunch
from sklearn.utils.validation import check_is_fitted

from skflow.compression import Quantizer
from skflow.embedder import BertEmbedder
from skflow.utils import install_hint

__all__ = ["MTEB_TASK_NAMES", "MTEBEncoder", "retrieval_task"]

INSTALL = install_hint("mteb")
MTEB_TASK_NAMES = {"scifact": "SciFact"}  # skflow's set names that MTEB spells otherwise
_BUNCH_KEYS = ("name", "split", "corpus_ids", "titles", "texts", "query_ids", "queries", "qrels")


def _import_mteb(what: str):
    try:
        import mteb
    except ImportError as exc:
        raise ImportError(f"{what} needs mteb: {INSTALL} ({exc})") from None
    return mteb


class MTEBEncoder:
    """A fitted skflow pipeline as an MTEB model: ``mteb.evaluate(MTEBEncoder(pipeline), tasks)``.

    It implements MTEB's encoder protocol (``encode``, ``similarity``,
    ``similarity_pairwise``, ``mteb_model_meta``): MTEB hands it the texts
    of each task, as queries or documents, and scores what it returns by
    cosine similarity. The texts go through the pipeline as ``transform``
    takes them: the `BertEmbedder`, then each fitted post-processing.
    MTEB's own compression wraps it like any MTEB model
    (``mteb.models.CompressionWrapper(MTEBEncoder(pipeline), ...)``).

    Parameters
    ----------
    model : BertEmbedder or Pipeline
        A `BertEmbedder`, or a fitted :class:`~sklearn.pipeline.Pipeline`
        that starts with one (``make_pipeline(BertEmbedder(...), Whitener())``
        fitted on a corpus) and ends in float vectors. Every step after the
        embedder must be fitted (the embedder's own ``fit`` is optional, as
        ever). A `Quantizer` is refused: its codes are not vectors that MTEB
        can score (see ``docs/mteb.md`` for what to do with codes).
    prompts : dict of str to str, default=None
        The embedder's prompt for each role or task, with MTEB's keys and
        MTEB's order of precedence (``"TASK-query"``, ``"TASK"``,
        ``"Retrieval-query"``, ``"Retrieval"``, ``"query"``): e.g.
        ``{"query": "query: ", "document": "passage: "}`` for E5. A text
        MTEB encodes for a role no key matches gets the embedder's own
        ``prompt``. The prompt replaces the embedder's ``prompt`` for that
        call; the steps after it are applied as they were fitted.
    name : str, default=None
        The model's name in MTEB's results, ``"organization/model"``.
        Default: ``"skflow/"``, the encoder's name, and the class of each
        step after it, e.g. ``"skflow/all-MiniLM-L6-v2+Whitener"``.

    Attributes
    ----------
    revision : str
        A fingerprint of the fitted pipeline and the prompts: MTEB keys its
        results cache by name and revision, so a pipeline fitted again, or
        other prompts, never read another's results.
    mteb_model_meta : mteb.models.ModelMeta
        What MTEB records of the model: the name, the revision, the
        encoder it is adapted from, its ``max_length``, cosine similarity.

    Examples
    --------
    >>> from skflow import BertEmbedder
    >>> from skflow.mteb import MTEBEncoder
    >>> model = MTEBEncoder(BertEmbedder(pooling="mean"), prompts={"query": "query: ", "document": "passage: "})
    >>> model.mteb_model_meta.name
    'skflow/all-MiniLM-L6-v2'
    >>> import mteb
    >>> model.prompt(mteb.get_task("SciFact").metadata, mteb.types.PromptType.query)
    'query: '
    """

    def __init__(self, model, *, prompts: Mapping[str, str] | None = None, name: str | None = None):
        self._embedder, self._steps = _split(model)  # refusals first: nothing imported, loaded or embedded
        self.prompts = _check_prompts(prompts)
        if name is not None and not (isinstance(name, str) and "/" in name.strip("/")):
            raise ValueError(f"name must be 'organization/model', as MTEB names models, got {name!r}.")
        _import_mteb("MTEBEncoder")
        for prompt in dict.fromkeys([self._embedder.prompt, *self.prompts.values()]):
            self._with_prompt(prompt).transform([])  # the embedder's own checks, from its configuration
        self.model = model
        self.name = name or _default_name(self._embedder, self._steps)
        try:
            self.revision = joblib.hash((model, sorted(self.prompts.items())))
        except (pickle.PicklingError, AttributeError, TypeError):  # a step that cannot be pickled (a lambda)
            self.revision = uuid.uuid4().hex  # this instance's own: never another pipeline's results
        self._meta = None

    @property
    def mteb_model_meta(self):
        if self._meta is None:
            from mteb.models import ModelMeta
            from mteb.models.model_meta import ScoringFunction

            self._meta = ModelMeta.create_empty({
                "name": self.name,
                "revision": self.revision,
                "adapted_from": str(self._embedder.model_name_or_path),
                "max_tokens": self._embedder.max_length,
                "embed_dim": _width(self.model),
                "similarity_fn_name": ScoringFunction.COSINE,
                "use_instructions": bool(self.prompts or self._embedder.prompt),
                "framework": ["PyTorch"],
            })
        return self._meta

    @mteb_model_meta.setter
    def mteb_model_meta(self, meta) -> None:  # mteb's CompressionWrapper records its precision here
        self._meta = meta

    def prompt(self, task_metadata, prompt_type=None) -> str | None:
        """The embedder's prompt for a task's queries or documents (``prompt_type``), by MTEB's precedence of keys.

        Parameters
        ----------
        task_metadata : mteb.TaskMetadata
            The task's metadata (its name and type choose among the keys).
        prompt_type : mteb.types.PromptType, default=None
            ``query`` or ``document``; None where the task has no roles.

        Returns
        -------
        prompt : str or None
            ``prompts`` at the most specific key that matches, else the
            embedder's own ``prompt``.
        """
        from mteb.models.abs_encoder import get_prompt

        found = get_prompt(self.prompts, task_metadata, prompt_type)
        return self._embedder.prompt if found is None else found

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs) -> np.ndarray:
        """The vectors of the texts of ``inputs``, in order: MTEB's encoder protocol.

        The embedder's own ``batch_size`` applies (MTEB's ``batch_size`` in
        ``kwargs`` is the size of the batches it hands over, not of the
        encoder's). Raises ``TypeError`` if the pipeline gives anything but
        one float vector a text.
        """
        texts = [text for batch in inputs for text in batch["text"]]
        X = self._with_prompt(self.prompt(task_metadata, prompt_type)).transform(texts)
        if self._steps is not None:
            X = self._steps.transform(X)
        X = np.asarray(X)
        if X.ndim != 2 or len(X) != len(texts) or not np.issubdtype(X.dtype, np.floating):
            last = type(self._steps[-1] if self._steps is not None else self._embedder).__name__
            raise TypeError(f"the pipeline's last step, {last}, gives {X.dtype} arrays of shape {X.shape} for "
                            f"{len(texts)} texts, not one float vector a text: MTEB scores vectors by cosine.")
        return X

    def similarity(self, embeddings1, embeddings2):
        """Cosine similarity of every row of ``embeddings1`` with every row of ``embeddings2`` (MTEB's ``cos_sim``)."""
        from mteb.similarity_functions import cos_sim

        return cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """Cosine similarity of each row of ``embeddings1`` with the same row of ``embeddings2``."""
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(embeddings1, embeddings2)

    def _with_prompt(self, prompt: str | None) -> BertEmbedder:
        if prompt == self._embedder.prompt:
            return self._embedder
        return copy.copy(self._embedder).set_params(prompt=prompt)  # fitted: encoder_identity_ comes along

    def __repr__(self) -> str:
        return f"MTEBEncoder({self.name!r}, revision={self.revision!r})"


def _split(model) -> tuple[BertEmbedder, Pipeline | None]:
    """The embedder and the steps after it, each checked: fitted, and not a Quantizer."""
    if isinstance(model, BertEmbedder):
        return model, None
    if not (isinstance(model, Pipeline) and isinstance(model.steps[0][1], BertEmbedder)):
        first = model.steps[0][1] if isinstance(model, Pipeline) else model
        raise TypeError(f"MTEBEncoder takes a BertEmbedder, or a Pipeline that starts with one; got "
                        f"{'a Pipeline that starts with ' if isinstance(model, Pipeline) else ''}"
                        f"{type(first).__name__}.")
    for name, step in model.steps[1:]:
        if step is None or (isinstance(step, str) and step == "passthrough"):
            continue
        if isinstance(step, Quantizer):
            raise TypeError(f"step {name!r} of the pipeline is a Quantizer: its codes are not vectors MTEB can score "
                            f"by cosine. Wrap the pipeline without it; MTEB's own compression is "
                            f"mteb.models.CompressionWrapper(MTEBEncoder(pipeline)), skflow's fitted codes are "
                            f"scored by skflow.evaluation.search_stored (see docs/mteb.md).")
        try:
            check_is_fitted(step)
        except NotFittedError:
            raise NotFittedError(f"step {name!r} of the pipeline ({type(step).__name__}) is not fitted: fit the "
                                 "pipeline on your documents first (pipeline.fit(documents)), then wrap it.") from None
    return model.steps[0][1], (model[1:] if len(model.steps) > 1 else None)


def _check_prompts(prompts) -> dict[str, str]:
    if prompts is None:
        return {}
    if not isinstance(prompts, Mapping):
        raise TypeError(f"prompts must be a dict of MTEB keys to prompts, e.g. {{'query': 'query: ', 'document': "
                        f"'passage: '}}, got a {type(prompts).__name__}.")
    for key, value in prompts.items():
        if not (isinstance(key, str) and key and isinstance(value, str)):
            raise TypeError(f"prompts must map non-empty strings to strings; got {key!r}: {value!r}.")
        if key == "passage" or key.endswith("-passage"):
            raise ValueError(f"prompts: MTEB calls the documents' role 'document', not 'passage' (key {key!r}); "
                             f"e.g. {{'document': {value!r}}}.")
    return dict(prompts)


def _default_name(embedder: BertEmbedder, steps: Pipeline | None) -> str:
    encoder = str(embedder.model_name_or_path).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    classes = [type(step).__name__ for _, step in (steps.steps if steps is not None else [])
               if step is not None and not (isinstance(step, str) and step == "passthrough")]
    return "skflow/" + "+".join([encoder or "encoder", *classes])


def _width(model) -> int | None:
    """The output width, where the pipeline tells it without embedding anything."""
    try:
        return len(model.get_feature_names_out())
    except (AttributeError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- the task
@functools.cache
def _task_base():
    from mteb.abstasks.retrieval import AbsTaskRetrieval

    class SkflowRetrievalTask(AbsTaskRetrieval):
        """An MTEB retrieval task whose data is a retrieval set that skflow read (``skflow_data``), never the hub."""

        skflow_data: Bunch

        def load_data(self, num_proc: int | None = None, **kwargs) -> None:
            if self.data_loaded:
                return
            from datasets import Dataset

            data = self.skflow_data
            corpus = Dataset.from_dict({"id": list(data.corpus_ids), "title": list(data.titles),
                                        "text": list(data.texts)})
            queries = Dataset.from_dict({"id": list(data.query_ids), "text": list(data.queries)})
            qrels = {query: dict(judged) for query, judged in data.qrels.items()}
            self.dataset = {"default": {data.split: {"corpus": corpus, "queries": queries, "relevant_docs": qrels,
                                                     "top_ranked": None}}}
            self.data_loaded = True

    return SkflowRetrievalTask


def retrieval_task(data: Bunch, *, name: str | None = None, language: str = "eng-Latn"):
    """A retrieval set read by :mod:`skflow.datasets` as an MTEB retrieval task: MTEB evaluates it, from local files.

    MTEB embeds each document as ``title + " " + text`` (stripped) and each
    query as it is, ranks the corpus by the model's similarity and scores
    the ranking with ``pytrec_eval`` (nDCG@10 is the main score), as for the
    tasks it downloads.

    Parameters
    ----------
    data : Bunch
        What :func:`skflow.datasets.load_beir` returns: ``name``, ``split``,
        ``corpus_ids``, ``titles``, ``texts``, ``query_ids``, ``queries``,
        ``qrels``.
    name : str, default=None
        The task's name in MTEB's results. Default: MTEB's name for the
        sets it knows (``"SciFact"``; `MTEB_TASK_NAMES`), else ``data.name``.
    language : str, default="eng-Latn"
        The language of the set, as MTEB writes it.

    Returns
    -------
    task : mteb.AbsTaskRetrieval
        Its ``metadata.dataset`` names the set and, as its revision, a
        sha256 of its ids, texts and judgements.

    Examples
    --------
    >>> from skflow.datasets import load_beir
    >>> from skflow.mteb import retrieval_task
    >>> task = retrieval_task(load_beir("scifact"))
    >>> task.metadata.name, task.metadata.main_score, task.metadata.eval_splits
    ('SciFact', 'ndcg_at_10', ['test'])
    """
    missing = [key for key in _BUNCH_KEYS if not hasattr(data, key)]
    if not isinstance(data, Mapping) or missing:
        raise TypeError(f"retrieval_task takes what skflow.datasets.load_beir returns; got a {type(data).__name__}"
                        + (f" without {', '.join(missing)}." if missing and isinstance(data, Mapping) else "."))
    if not len(data.corpus_ids) == len(data.titles) == len(data.texts) or len(data.query_ids) != len(data.queries):
        raise ValueError(f"retrieval set {data.name!r}: {len(data.corpus_ids)} document ids for "
                         f"{len(data.titles)} titles and {len(data.texts)} texts, {len(data.query_ids)} query ids "
                         f"for {len(data.queries)} queries.")
    _import_mteb("retrieval_task")
    from mteb import TaskMetadata

    name = name or MTEB_TASK_NAMES.get(data.name, data.name)
    metadata = TaskMetadata(
        name=name,
        description=f"{name}, read from local files by skflow.datasets.load_beir.",
        dataset={"path": f"skflow:{data.name}", "revision": _digest(data)},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=[data.split],
        eval_langs=[language],
        main_score="ndcg_at_10",
    )
    task_class = type("SkflowRetrievalTask", (_task_base(),), {"metadata": metadata, "skflow_data": data})
    return task_class()


def _digest(data: Bunch) -> str:
    """sha256 of a set's ids, titles, texts and judgements, as the task's revision."""
    digest = hashlib.sha256()
    for rows in (zip(data.corpus_ids, data.titles, data.texts), zip(data.query_ids, data.queries),
                 ((q, d, str(s)) for q, judged in sorted(data.qrels.items()) for d, s in sorted(judged.items()))):
        for row in rows:
            digest.update("\t".join(row).encode("utf-8", "surrogatepass") + b"\n")
        digest.update(b"\0")
    return digest.hexdigest()

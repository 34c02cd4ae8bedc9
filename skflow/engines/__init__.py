"""Engine indexes: a fitted pipeline's outputs for a corpus in faiss or usearch, exact or HNSW, searched with raw
float queries (:class:`EngineIndex`); see ``docs/engines.md``. The engines are an optional extra:
skflow's ``engines`` extra (faiss-cpu and usearch)."""

from skflow.engines._engines import ENGINES, HNSW_PARAMS, INDEXES, require_engine
from skflow.engines._index import EngineIndex

__all__ = ["ENGINES", "HNSW_PARAMS", "INDEXES", "EngineIndex", "require_engine"]

"""Scoring helpers shared by `LLM.score` and the server's /score and /rerank: the (query, document)
pairs of a request, and the cosine of two embeddings (an embedding model's score)."""

import math
from collections.abc import Sequence

from pagedserve.errors import InvalidRequestError


def score_pairs(queries: str | Sequence[str], documents: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """One query against every document, or equal lists paired one to one (vLLM's rule)."""
    q = [queries] if isinstance(queries, str) else list(queries)
    d = [documents] if isinstance(documents, str) else list(documents)
    if not q or not d:
        raise InvalidRequestError("Scoring needs at least one query and one document.", param="documents")
    if len(q) == 1:
        q = q * len(d)
    if len(q) != len(d):
        raise InvalidRequestError(
            f"Got {len(q)} queries and {len(d)} documents: pass one query, or as many queries as documents.",
            param="text_1",
        )
    return q, d


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0

"""The pooling endpoints (--runner pooling): /v1/embeddings, /pooling, /classify, /score, /rerank. Each
input becomes one pooling request through the same frontend as generation (tokenized in a thread,
admitted all or none under the queue limits, --request-timeout), and comes back as one vector."""

import asyncio
import base64
import time
from collections.abc import Sequence

import numpy as np

from pagedserve.engine.input_processor import PromptType
from pagedserve.engine.pooling_input import PoolingOptions, tokenize_pair
from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.entrypoints.openai.protocol_pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingInput,
    PoolingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from pagedserve.entrypoints.openai.serving_engine import OpenAIServing, random_id, usage_info
from pagedserve.entrypoints.scoring import cosine, score_pairs
from pagedserve.entrypoints.utils import merge_async_iterators
from pagedserve.errors import InvalidRequestError, RequestFailedError
from pagedserve.outputs import RequestOutput
from pagedserve.protocol import EngineCoreRequest


def split_input(value: PoolingInput) -> list[PromptType]:
    """OpenAI's `input`: a text, texts, one prompt's token ids or several prompts' token ids."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequestError("input must not be an empty list: give at least one input.", param="input")
    if isinstance(value[0], int):
        return [list(value)]
    return list(value)


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """float: the list; base64: little-endian float32 bytes (what the openai client decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


class OpenAIServingPooling(OpenAIServing):
    async def pool(
        self, prefix: str, prompts: Sequence[PromptType], options: Sequence[PoolingOptions]
    ) -> list[RequestOutput]:
        """Every prompt's final output, in order; raises InvalidRequestError before any is queued."""

        def process() -> list[EngineCoreRequest]:
            return [
                self.engine.process_pooling_inputs(f"{prefix}-{i}", prompt, option)
                for i, (prompt, option) in enumerate(zip(prompts, options))
            ]

        core_requests = await asyncio.to_thread(process)
        finals: dict[int, RequestOutput] = {}
        async for index, output in merge_async_iterators(*self.engine.submit(core_requests)):
            finals[index] = output
        results = [finals[i] for i in range(len(core_requests))]
        for result in results:
            if result.pooled is None:
                reason = result.outputs[0].finish_reason if result.outputs else None
                raise RequestFailedError(
                    f"Request {result.request_id} ended ({reason}) before it was pooled."
                )
        return results

    async def embeddings(self, request: EmbeddingRequest) -> EmbeddingResponse:
        self.check_model(request.model)
        prompts = split_input(request.input)
        request_id = random_id("embd")
        results = await self.pool(request_id, prompts, [_embedding_options("embed", request)] * len(prompts))
        return EmbeddingResponse(
            id=request_id,
            created=int(time.time()),
            model=self.model_name,
            data=[
                EmbeddingData(index=i, embedding=encode_vector(r.pooled or [], request.encoding_format))
                for i, r in enumerate(results)
            ],
            usage=_usage(results),
        )

    async def pooling(self, request: EmbeddingRequest) -> PoolingResponse:
        """vLLM's /pooling: the model's own task (an embedding, or a classifier's probabilities)."""
        self.check_model(request.model)
        prompts = split_input(request.input)
        request_id = random_id("pool")
        results = await self.pool(request_id, prompts, [_embedding_options("encode", request)] * len(prompts))
        return PoolingResponse(
            id=request_id,
            created=int(time.time()),
            model=self.model_name,
            data=[
                PoolingData(index=i, data=encode_vector(r.pooled or [], request.encoding_format))
                for i, r in enumerate(results)
            ],
            usage=_usage(results),
        )

    async def classify(self, request: ClassificationRequest) -> ClassificationResponse:
        self.check_model(request.model)
        prompts = split_input(request.input)
        option = PoolingOptions("classify", truncate_prompt_tokens=request.truncate_prompt_tokens)
        request_id = random_id("classify")
        results = await self.pool(request_id, prompts, [option] * len(prompts))
        labels = getattr(self.engine.config.model.hf_config, "id2label", None) or {}
        data = []
        for i, result in enumerate(results):
            probs = result.pooled or []
            best = max(range(len(probs)), key=probs.__getitem__) if probs else 0
            data.append(
                ClassificationData(index=i, label=labels.get(best), probs=probs, num_classes=len(probs))
            )
        return ClassificationResponse(
            id=request_id, created=int(time.time()), model=self.model_name, data=data, usage=_usage(results)
        )

    async def scores(
        self, request_id: str, queries: list[str], documents: list[str], truncate: int | None
    ) -> tuple[list[float], int]:
        """One score per pair, and the prompt tokens counted: a cross-encoder's head over each pair
        (tokenized as its tokenizer pairs texts), else the cosine of the two embeddings."""
        pooling = self.engine.config.model.pooling
        if pooling is not None and pooling.task == "classify":
            pairs = await asyncio.to_thread(
                lambda: [tokenize_pair(self.tokenizer, q, d) for q, d in zip(queries, documents)]
            )
            results = await self.pool(
                request_id,
                [{"prompt_token_ids": ids} for ids, _ in pairs],
                [
                    PoolingOptions("classify", truncate_prompt_tokens=truncate, token_type_start=s)
                    for _, s in pairs
                ],
            )
            return [(r.pooled or [0.0])[0] for r in results], _num_tokens(results)
        texts = list(dict.fromkeys([*queries, *documents]))  # each text embedded once
        option = PoolingOptions("embed", truncate_prompt_tokens=truncate)
        results = await self.pool(request_id, texts, [option] * len(texts))
        vectors = {text: r.pooled or [] for text, r in zip(texts, results)}
        return [cosine(vectors[q], vectors[d]) for q, d in zip(queries, documents)], _num_tokens(results)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        self.check_model(request.model)
        queries, documents = score_pairs(request.text_1, request.text_2)
        request_id = random_id("score")
        scores, num_tokens = await self.scores(request_id, queries, documents, request.truncate_prompt_tokens)
        return ScoreResponse(
            id=request_id,
            created=int(time.time()),
            model=self.model_name,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=usage_info(num_tokens, 0),
        )

    async def rerank(self, request: RerankRequest) -> RerankResponse:
        """Cohere's / Jina's shape: the documents by relevance, the `top_n` best."""
        self.check_model(request.model)
        if not request.documents:
            raise InvalidRequestError("documents must not be empty: give at least one.", param="documents")
        if request.top_n is not None and request.top_n < 1:
            raise InvalidRequestError(f"top_n must be at least 1, got {request.top_n}.", param="top_n")
        request_id = random_id("rerank")
        queries, documents = score_pairs(request.query, request.documents)
        scores, num_tokens = await self.scores(request_id, queries, documents, request.truncate_prompt_tokens)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: request.top_n or len(scores)]
        return RerankResponse(
            id=request_id,
            model=self.model_name,
            results=[
                RerankResult(
                    index=i,
                    relevance_score=scores[i],
                    document=RerankDocument(text=documents[i]) if request.return_documents else None,
                )
                for i in order
            ],
            usage=RerankUsage(total_tokens=num_tokens),
        )


def _embedding_options(task: str, request: EmbeddingRequest) -> PoolingOptions:
    """/v1/embeddings' and /pooling's fields as each input's pooling options."""
    return PoolingOptions(
        task,
        request.dimensions,
        request.normalize,
        truncate_prompt_tokens=request.truncate_prompt_tokens,
        prompt_name=request.prompt_name,
    )


def _num_tokens(results: list[RequestOutput]) -> int:
    return sum(len(r.prompt_token_ids) for r in results)


def _usage(results: list[RequestOutput]) -> UsageInfo:
    return usage_info(_num_tokens(results), 0)

"""The pooling routes (--runner pooling): /v1/embeddings, /pooling, /classify, /score and /v1/score,
/rerank, /v1/rerank and /v2/rerank. On a generation model each answers 400 naming the runner to use."""

from fastapi import FastAPI, Request

from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES
from pagedserve.entrypoints.openai.protocol_pooling import (
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingInput,
    PoolingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedserve.entrypoints.utils import with_cancellation


def _num_inputs(value: PoolingInput | list[str]) -> int:
    return 1 if isinstance(value, str) or (value and isinstance(value[0], int)) else len(value)


def add_pooling_routes(app: FastAPI, serving: OpenAIServingPooling, bounds: RequestBounds) -> None:
    @app.post("/v1/embeddings", responses=ERROR_RESPONSES)
    @with_cancellation
    async def embeddings(request: EmbeddingRequest, raw_request: Request) -> EmbeddingResponse:
        bounds.check_pooling(_num_inputs(request.input), "input")
        return await serving.embeddings(request)

    @app.post("/pooling", responses=ERROR_RESPONSES)
    @with_cancellation
    async def pooling(request: EmbeddingRequest, raw_request: Request) -> PoolingResponse:
        bounds.check_pooling(_num_inputs(request.input), "input")
        return await serving.pooling(request)

    @app.post("/classify", responses=ERROR_RESPONSES)
    @with_cancellation
    async def classify(request: ClassificationRequest, raw_request: Request) -> ClassificationResponse:
        bounds.check_pooling(_num_inputs(request.input), "input")
        return await serving.classify(request)

    for path in ("/score", "/v1/score"):

        @app.post(path, responses=ERROR_RESPONSES)
        @with_cancellation
        async def score(request: ScoreRequest, raw_request: Request) -> ScoreResponse:
            bounds.check_pooling(max(_num_inputs(request.text_1), _num_inputs(request.text_2)), "text_2")
            return await serving.score(request)

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):

        @app.post(path, responses=ERROR_RESPONSES)
        @with_cancellation
        async def rerank(request: RerankRequest, raw_request: Request) -> RerankResponse:
            bounds.check_pooling(len(request.documents), "documents")
            return await serving.rerank(request)

"""google-genai's readings of Veo's raw answers, as types a payload can be parsed with.

The SDK's GenerateVideosOperation is its reading of an operation, not the wire: `operations.get` turns each raw
answer into it through the API's own converter (`from_api_response`, Vertex AI's or the Gemini API's), which
renames the fields and decodes inline video bytes. These types do the same, so PROVENANCE.toml can name them for
a recorded operation as it came over the wire.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import pydantic
from google.genai import types


def _read(raw: Any, *, vertex: bool) -> types.GenerateVideosOperation:
    if not isinstance(raw, dict):
        raise ValueError("an operation is a JSON object")
    return types.GenerateVideosOperation.from_api_response(raw, is_vertex_ai=vertex)


# A `fetchPredictOperation` (or `predictLongRunning`) answer of Vertex AI, as the SDK reads it.
VertexOperation = Annotated[types.GenerateVideosOperation, pydantic.BeforeValidator(partial(_read, vertex=True))]
# A Gemini API operation (`GET /v1/{name}`), as the SDK reads it.
GeminiOperation = Annotated[types.GenerateVideosOperation, pydantic.BeforeValidator(partial(_read, vertex=False))]


def vertex_operation(raw: dict[str, Any]) -> types.GenerateVideosOperation:
    return pydantic.TypeAdapter(VertexOperation).validate_python(raw)


def gemini_operation(raw: dict[str, Any]) -> types.GenerateVideosOperation:
    return pydantic.TypeAdapter(GeminiOperation).validate_python(raw)

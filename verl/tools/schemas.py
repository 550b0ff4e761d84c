"""veRL's tool schemas: OpenAI function-calling schemas (what the chat template shows the model), parsed calls, and
:class:`ToolResponse` (what a tool hands back to the model)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function (``items`` and other JSON-schema keys are kept as given).

    As in veRL 0.10, ``type`` may be a list (``["integer", "number"]`` for ``int | float``) and ``enum`` may hold any
    JSON values (``Literal[1, 2]``); ``type`` may also be absent (an ``Any`` parameter, or one described by
    ``anyOf``).
    """

    model_config = ConfigDict(extra="allow")

    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object of a function (``required`` may be omitted: no parameter is required)."""

    model_config = ConfigDict(extra="allow")

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """A function: name, description, parameters."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """``{"type": "function", "function": {...}}``: how a tool is described to the model."""

    type: str
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as the model wrote it: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with decoded arguments."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed: OpenAIFunctionParsedSchema,
    ) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode the arguments; returns the call and whether decoding failed (then ``arguments`` is ``{}``)."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    """A tool call with its id."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns to the model: text, and (multi-modal models) lists of images / videos."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _lists(cls, values: Any) -> Any:
        if isinstance(values, dict):
            for key in ("image", "video"):
                if values.get(key) is not None and not isinstance(values[key], list):
                    raise ValueError(f"ToolResponse.{key} must be a list (wrap one item as [item])")
        return values

    def is_empty(self) -> bool:
        """No text, image or video."""
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        """Text and nothing else."""
        return bool(self.text) and not self.image and not self.video

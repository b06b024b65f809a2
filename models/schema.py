"""MCP ``inputSchema`` / ``outputSchema`` generated from the pydantic models (never written by hand).

Schemas are JSON Schema 2020-12 (the MCP default), fully inlined: no ``$ref``/``$defs``,
because several hosts still mishandle references and none of our models is recursive.
Absent optional fields publish no ``default`` (pydantic would write ``"default": null``),
generated titles are dropped, and every object is closed.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from engram_memory.models.context import ALL_TOOLS, TOOL_PREFIX
from engram_memory.models.outputs import FailureEnvelope, success_envelope_model
from engram_memory.models.tools import INPUT_MODELS

TOOL_NAMES: dict[str, str] = {tool: TOOL_PREFIX + tool for tool in ALL_TOOLS}

# Keywords whose value is a schema, a list of schemas, or a name -> schema map.
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")


class ContractJsonSchema(GenerateJsonSchema):
    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        # `= None` marks an optional field whose absence is meaningful; null itself is refused.
        if "default" in schema and schema["default"] is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every ``$ref`` and drop ``title``; only schema positions are walked, never data."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **siblings}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key in _SUBSCHEMA:
            out[key] = _resolve(value, defs)
        elif key in _SUBSCHEMA_LISTS:
            out[key] = [_resolve(v, defs) for v in value]
        elif key in _SUBSCHEMA_MAPS:
            out[key] = {name: _resolve(v, defs) for name, v in value.items()}
        else:
            out[key] = value
    return out


def _model_schema(model: Any) -> dict[str, Any]:
    raw = model.model_json_schema(mode="validation", schema_generator=ContractJsonSchema)
    return _resolve(raw, raw.get("$defs", {}))


@cache
def _input_schema(tool: str) -> dict[str, Any]:
    return _model_schema(INPUT_MODELS[tool])


@cache
def _output_schema(tool: str) -> dict[str, Any]:
    # MCP requires type "object" at the root; the two envelope branches exclude each other on `ok`.
    return {
        "type": "object",
        "oneOf": [_model_schema(success_envelope_model(tool)), _model_schema(FailureEnvelope)],
    }


def input_schema(tool: str) -> dict[str, Any]:
    """The tool's closed argument schema (a fresh copy: callers may mutate it)."""
    return copy.deepcopy(_input_schema(tool))


def output_schema(tool: str) -> dict[str, Any]:
    """The schema of the whole envelope carried in ``structuredContent`` (success or failure)."""
    return copy.deepcopy(_output_schema(tool))

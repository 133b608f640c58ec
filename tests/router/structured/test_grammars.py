"""router.structured.grammars without a model: what a schema may hold, and the grammar made of it."""

from __future__ import annotations

import pytest

from router.errors import RequestError
from router.generation import ResponseFormat
from router.structured.grammars import MAX_GRAMMAR_REPEAT, check_schema, grammar_for


def schema_format(schema: dict) -> ResponseFormat:
    return ResponseFormat("json_schema", schema, "x")


def test_grammars_are_cached_per_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert grammar_for(schema_format(schema)) is grammar_for(schema_format(dict(schema)))


def test_strings_keep_control_characters_out() -> None:
    gbnf = grammar_for(ResponseFormat("json_object"))
    char = next(line for line in gbnf.splitlines() if line.startswith("char ::="))
    assert r"\x00-\x1F" in char


def test_properties_keep_their_order() -> None:
    gbnf = grammar_for(
        schema_format({"type": "object", "properties": {"zeta": {}, "alpha": {}}, "required": ["zeta", "alpha"]})
    )
    root = next(line for line in gbnf.splitlines() if line.startswith("root ::="))
    assert root.index("zeta") < root.index("alpha")


def test_large_bounds_are_left_to_the_verifier() -> None:
    small = grammar_for(schema_format({"type": "string", "maxLength": 3}))
    large = grammar_for(schema_format({"type": "string", "maxLength": MAX_GRAMMAR_REPEAT + 1}))
    assert small.count("char") > large.count("char")  # the bound is expanded only when small


def test_pydantic_shapes_are_accepted() -> None:
    # a recursive model: pydantic puts a $ref at the root beside $defs
    tree = {
        "$defs": {
            "Node": {
                "title": "Node",
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    assert "kids" in grammar_for(schema_format(tree))
    optional = {
        "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
        "type": "object",
    }
    check_schema(optional)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "properties": {"a": {"not": {}}}}, "'#/properties/a': keyword 'not'"),
        ({"patternProperties": {"^a": {}}}, "patternProperties"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"type": "string", "pattern": "^a{1000000000}$"}, "repeat at most"),
        ({"type": "string", "pattern": "^[a-z]{100}$"}, "repeat at most"),
        ({"type": "string", "pattern": "^((a{60}){60}){60}$"}, None),  # rules per level: stays small
    ],
)
def test_refusals_name_the_construct(schema: dict, words: str | None) -> None:
    if words is None:
        grammar_for(schema_format(schema))
        return
    with pytest.raises(RequestError) as err:
        grammar_for(schema_format(schema))
    assert words in str(err.value) and err.value.param == "response_format"

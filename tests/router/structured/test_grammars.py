"""router.structured.grammars without a model: what a schema may hold, the grammar made of it, and the bound
on the work that grammar can make llama.cpp do per token (router.structured.grammar_bound)."""

from __future__ import annotations

import pytest

from router.errors import RequestError
from router.generation import GenerationRequest, Message, NamedTool, ResponseFormat, ToolSpec
from router.structured import grammar_bound
from router.structured.grammars import (
    MAX_GRAMMAR_REPEAT,
    MAX_REQUEST_SCHEMA_BYTES,
    check_schema,
    check_schema_bytes,
    grammar_for,
    grammar_source,
    schema_key,
    schema_known,
)


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


# ---- the bound on decoding work (router.structured.grammar_bound) -------------------------------------------
# The figures behind these limits: scripts/grammar_cost.py (the real llama.cpp grammar engine).

ISSUE_26 = "^a(((a?){12}){12}){12}$"  # one request froze the local tier: 24 s for one token
EXPLOSIVE = [
    ISSUE_26,
    "^a(((a?){16}){16}){16}$",
    "^a(((a?){24}){24}){24}$",
    "^a(a?){64}$",  # one level was enough: 41 ms a token on average
    "^a((a|){12}){12}$",  # an alternative that matches nothing is an optional too
    "^a((a*){12}){12}$",
    "^a((a?)*){64}$",
    "^((a|aa){16}){16}$",  # no empty match, but every split of the a's is alive at once
    "^([a-z]{1,32}){1,32}$",
    "^(" + "(a?){8}b" * 8 + ")$",
]


@pytest.mark.parametrize("pattern", EXPLOSIVE)
def test_a_pattern_that_multiplies_parse_states_is_left_to_the_verifier(pattern: str) -> None:
    assert grammar_bound.pattern_stacks(pattern) > grammar_bound.MAX_GRAMMAR_STACKS
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}, "required": ["x"]}
    check_schema(schema)  # the request is served: the format verifier checks the pattern on the answer
    plain = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    assert grammar_for(schema_format(schema)) == grammar_for(schema_format(plain))


@pytest.mark.parametrize(
    ("pattern", "stacks"),
    [
        ("^[0-9]{4}-[0-9]{2}-[0-9]{2}$", 3),  # rigid: one place at a time
        ("^((a{60}){60}){60}$", 5),  # rigid however deeply repeated
        ("^[a-z]{1,64}$", 3),  # a variable tail: the next character, or the end
        ("^a(a?){4}$", 17),  # four optional a's in a row: each reaches the others, squared
        ("^a(a?){12}$", 145),
        ("^([a-z]{1,8}){1,8}$", 65),  # 64 positions, any of which the a's so far may have reached
        ("^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+[.][a-zA-Z]{2,}$", 9),
        ("^(https?|ftp)://[^ /]+(/[^ ]*)?$", 12),
    ],
)
def test_pattern_bounds(pattern: str, stacks: int) -> None:
    assert grammar_bound.pattern_stacks(pattern) == stacks


@pytest.mark.parametrize("pattern", ["^(a|b)*c$", "^[0-9]{3}-[0-9]{4}$", "^((a{60}){60}){60}$", "^a(a?){12}$"])
def test_patterns_within_the_bound_stay_in_the_grammar(pattern: str) -> None:
    schema = {"type": "string", "pattern": pattern}
    assert grammar_for(schema_format(schema)) != grammar_for(schema_format({"type": "string"}))


def _chain(depth: int) -> dict:
    """`depth` levels of two objects that begin alike ({"p": <next level>}): both stay alive, and
    the live states double with each level."""
    defs: dict = {f"d{depth}": {"type": "string"}}
    for i in range(depth - 1, -1, -1):
        nxt = {"$ref": f"#/$defs/d{i + 1}"}
        one = {"type": "object", "properties": {"p": nxt}, "required": ["p"]}
        two = {"type": "object", "properties": {"p": nxt, "q": {"type": "integer"}}, "required": ["p", "q"]}
        defs[f"d{i}"] = {"anyOf": [one, two]}
    return {**defs.pop("d0"), "$defs": defs}


def _alike_recursive() -> dict:
    union = {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    kids = {"type": "array", "items": union}
    return {
        "type": "object",
        "properties": {"item": union},
        "required": ["item"],
        "$defs": {
            "A": {"type": "object", "properties": {"kids": kids, "x": {"type": "integer"}}, "required": ["kids", "x"]},
            "B": {"type": "object", "properties": {"kids": kids, "y": {"type": "string"}}, "required": ["kids", "y"]},
        },
    }


@pytest.mark.parametrize("schema", [_chain(12), _chain(40), _alike_recursive()], ids=["chain12", "chain40", "alike"])
def test_alternatives_that_multiply_are_refused_naming_the_param(schema: dict) -> None:
    with pytest.raises(RequestError) as err:
        check_schema(schema, param="tools.3.function.parameters")
    assert err.value.param == "tools.3.function.parameters" and err.value.code == "grammar_too_costly"
    assert "parse states" in str(err.value) or "levels deep" in str(err.value)


def test_alternatives_that_part_early_are_served() -> None:
    leaf = {
        "type": "object",
        "properties": {"kind": {"const": "leaf"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/T"}}},
        "required": ["kind", "kids"],
    }
    branch = {**leaf, "properties": {**leaf["properties"], "kind": {"const": "branch"}}}
    # a recursive union told apart by a const first property, as pydantic's discriminated unions are
    tagged = {"$defs": {"T": {"anyOf": [leaf, branch]}}, "$ref": "#/$defs/T"}
    # Optional[Node]: a recursive object or null, which part at the first character
    optional = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "v": {"type": "string"},
                    "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["v", "next"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    # 500 values that part within their first two characters (`ab-12`): each alive about a token
    parting = [f"{chr(97 + i % 26)}{chr(97 + i // 26)}-{i}" for i in range(500)]
    many_values = {"type": "object", "properties": {"c": {"enum": parting}}}
    for schema in (tagged, optional, many_values, _chain(4)):
        check_schema(schema)
        grammar_for(schema_format(schema))


@pytest.mark.parametrize("shared", ["value-", "abcdefghijklmnop"])
def test_enum_values_that_share_a_beginning_count_whole(shared: str) -> None:
    # 850 values sharing 30 characters stay alive together for a dozen tokens: 505 ms a vocabulary
    # scan and 3 ms a token, against 176 ms and 1.8 ms for a pattern at the bound
    # (scripts/grammar_cost.py --cases enum850-prefix30); an eighth each let them through as 107
    values = [f"{shared}{i:04d}" for i in range(850)]
    for schema in (
        {"type": "object", "properties": {"c": {"enum": values}}},
        {"anyOf": [{"const": v} for v in values[:600]]},
    ):
        with pytest.raises(RequestError) as err:
            check_schema(schema)
        assert err.value.code == "grammar_too_costly" and "parse states" in str(err.value)
    assert grammar_bound.plan({"enum": values[:256]}).stacks == 256  # as costly as the bound's pattern
    with pytest.raises(RequestError):
        grammar_bound.plan({"enum": values[:257]})


def test_a_forced_call_among_many_tools_is_within_the_bound() -> None:
    # tools.forced_call_schema's shape: one object per function, its const name first
    calls = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": f"f{i}"}, "arguments": {"type": "object", "properties": {"a": {}}}},
                "required": ["name", "arguments"],
            }
            for i in range(128)
        ]
    }
    assert grammar_bound.plan(calls).stacks <= grammar_bound.MAX_GRAMMAR_STACKS


def test_patterns_go_when_only_without_them_the_schema_fits() -> None:
    # each pattern alone is within the bound; 64 strings alike hold them all alive at once
    schema = {"anyOf": [{"type": "string", "pattern": f"^([a-z]{{1,4}}){{1,4}}{chr(97 + i % 26)}$"} for i in range(64)]}
    assert grammar_bound.plan(schema).dropped == {s["pattern"] for s in schema["anyOf"]}
    check_schema(schema)


def test_a_pattern_the_bound_cannot_read_is_judged_by_the_converter() -> None:
    schema = {"type": "string", "pattern": "(?<=a)b"}  # a lookbehind, unanchored: the converter refuses both
    check_schema(schema)  # a remote tier may still take it; the verifier checks it on the answer
    with pytest.raises(RequestError) as err:
        grammar_for(schema_format(schema))
    assert "Pattern" in str(err.value) and err.value.param == "response_format"
    assert grammar_bound.plan(schema).unreadable == {"(?<=a)b"}


def test_the_bounds_own_work_is_bounded() -> None:
    # every level offers both definitions of the next: 2**60 paths, visited once each per set
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/e{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(60)}
    defs |= {f"e{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i}"}} for i in range(61)}
    defs["d60"] = {"type": "string"}
    with pytest.raises(RequestError) as err:
        check_schema({"$defs": defs, "$ref": "#/$defs/d0"})
    assert err.value.code == "grammar_too_costly"
    # anyOf of anyOf, each naming the next twice: 2**60 ways down to a string, or back to the top
    lattice = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(60)}
    for last in ({"type": "string"}, {"anyOf": [{"$ref": "#/$defs/a0"}]}):
        with pytest.raises(RequestError) as err:
            check_schema({"$defs": {**lattice, "a60": last}, "$ref": "#/$defs/a0"})
        assert err.value.code == "grammar_too_costly"


def test_checks_are_remembered_and_schema_bytes_capped() -> None:
    schema = {"type": "object", "properties": {"remembered": {"type": "integer"}}}
    assert not schema_known(schema)
    check_schema(schema)
    assert schema_known(schema) and schema_known(dict(schema))
    bad = {"type": "object", "properties": {"a": {"not": {}}}}
    for param in ("response_format", "tools.0.function.parameters"):  # a remembered refusal names its param
        with pytest.raises(RequestError) as err:
            check_schema(bad, param=param)
        assert err.value.param == param
    big = {"type": "object", "description": "x" * 30_000}
    with pytest.raises(RequestError) as err:
        check_schema_bytes([big] * 9, "tools")
    assert err.value.param == "tools" and str(MAX_REQUEST_SCHEMA_BYTES) in str(err.value)
    check_schema_bytes([big] * 8, "tools")


def test_a_schema_too_deep_to_encode_is_a_bad_request() -> None:
    """The backstop behind the request bodies' depth bound: a schema nested past what the JSON
    encoder can walk is a RequestError naming where it came from, never a RecursionError (a 500)."""
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(RequestError):
        schema_key(deep)
    with pytest.raises(RequestError) as err:
        check_schema_bytes([deep], "tools")
    assert err.value.param == "tools"
    assert not schema_known(deep)


def test_the_grammar_is_named_by_its_source() -> None:
    """A forced call's grammar is made of the functions it may call: a refusal names the one
    function (or all of them), a response_format's names the response_format."""
    params = '{"type":"object"}'
    offered = (ToolSpec("f", None, params, True), ToolSpec("g", None, params, True))
    ask = (Message("user", "hi"),)
    assert grammar_source(GenerationRequest(messages=ask)) == "response_format"
    assert grammar_source(GenerationRequest(messages=ask, tools=offered, tool_choice="auto")) == "response_format"
    assert grammar_source(GenerationRequest(messages=ask, tools=offered, tool_choice="required")) == "tools"
    named = GenerationRequest(messages=ask, tools=offered, tool_choice=NamedTool("g"))
    assert grammar_source(named) == "tools.1.function.parameters"
    one = GenerationRequest(messages=ask, tools=offered[:1], tool_choice="required")
    assert grammar_source(one) == "tools.0.function.parameters"

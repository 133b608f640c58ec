"""router.structured.tools: tools rendered into the prompt (the model's own template, or the fallback system
prompt), calls read back from the text, and the stream filter that holds back what may be a call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from router.generation import Generation, GenerationRequest, Message, NamedTool, ToolCall, ToolSpec
from router.structured import tools
from verifiers.jsonschema_check import first_error
from verifiers.tool_call import ToolCallVerifier

WEATHER = ToolSpec(
    "get_weather",
    "The current weather in a city",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
TIME = ToolSpec("get_time", "The local time in a city", None)
QWEN = Path.home() / ".cache/tierroute/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
HISTORY = (
    Message("user", "Weather in Paris?"),
    Message("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    Message("tool", "21 C, sunny", tool_call_id="call_1"),
)


def request(*messages: Message, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=messages or (Message("user", "Weather in Paris?"),), tools=(WEATHER, TIME), **kw)  # type: ignore[arg-type]


def gen(text: str, calls: tuple[ToolCall, ...] | None = None) -> Generation:
    return Generation(text, "stop", 1, 1, None, 0.0, tool_calls=calls)


def test_a_tagged_call_is_read_with_its_arguments_as_json_text() -> None:
    found = tools.parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert found.content is None and not found.malformed
    (call,) = found.calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")


def test_several_calls_text_around_them_and_a_missing_closing_tag_at_the_end() -> None:
    text = 'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n<tool_call>{"name": "get_time", "parameters": {"city": "Oslo"}}'
    found = tools.parse_tool_calls(text)
    assert [c.name for c in found.calls] == ["get_weather", "get_time"]
    assert json.loads(found.calls[1].arguments) == {"city": "Oslo"}  # `parameters`, as small models write it
    assert found.content == "Let me look."


def test_untagged_calls_are_read_when_the_answer_is_nothing_else() -> None:
    # Qwen2.5's tags are special tokens the engine does not spell out: its calls arrive bare
    found = tools.parse_tool_calls(
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_time", "arguments": "{}"}'
    )
    assert [c.name for c in found.calls] == ["get_weather", "get_time"] and found.calls[1].arguments == "{}"
    fenced = tools.parse_tool_calls('```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```')
    assert [c.name for c in fenced.calls] == ["get_weather"] and fenced.content is None
    # doubled braces, copied from Qwen2.5-Coder-1.5B's own template
    for doubled in (
        '{{"name": "get_time", "arguments": {}}}',
        '<tool_call>\n{{"name": "get_time", "arguments": {}}}\n</tool_call>',
    ):
        assert [c.name for c in tools.parse_tool_calls(doubled).calls] == ["get_time"]
    # a call written again with a made-up result after it (Qwen2.5-Coder-0.5B handed a result)
    echo = tools.parse_tool_calls('{"name": "get_time", "arguments": {"city": "Oslo"}}\n{"time": "14:05"}')
    assert [c.name for c in echo.calls] == ["get_time"] and echo.content == '{"time": "14:05"}'
    for text in (
        "```python\nprint(1)\n```",
        '{"name": "get_time", "arguments": {}}\nThe time is 14:05.',
        '{"city": "Paris"}',
        '{"name": "x", "arguments": {}, "other": 1}',
        'Here: {"name": "x", "arguments": {}}',
    ):
        assert tools.parse_tool_calls(text).calls == (), text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<tool_call>{not json}</tool_call>", "not JSON"),
        ('<tool_call>["get_weather"]</tool_call>', "not an object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no function name"),
    ],
)
def test_a_malformed_block_is_reported_and_the_text_stays_content(text: str, why: str) -> None:
    found = tools.parse_tool_calls(text)
    assert found.calls == () and found.content == text and why in found.malformed[0]


def test_arguments_nested_past_the_bound_are_malformed_not_a_crash() -> None:
    # JSON some thousand deep raised RecursionError out of the reader (json's own decoder), so the
    # tool_call verifier and the response renderer raised too; a few hundred tokens of brackets do it
    deep = '{"name": "get_weather", "arguments": {"city": ' + "[" * 5000 + "]" * 5000 + "}}"
    found = tools.parse_tool_calls(f"<tool_call>\n{deep}\n</tool_call>")
    assert found.calls == () and f"nested more than {tools.MAX_NESTING} deep" in found.malformed[0]
    assert tools.parse_tool_calls(deep).calls == ()  # untagged, as Qwen writes calls: plain text, no call
    over = '{"name": "get_weather", "arguments": {"city": ' + "[" * 64 + "]" * 64 + "}}"
    assert "nested more than" in tools.parse_tool_calls(f"<tool_call>{over}</tool_call>").malformed[0]
    within = '{"name": "get_weather", "arguments": {"city": ' + "[" * 62 + "]" * 62 + "}}"
    assert len(tools.parse_tool_calls(f"<tool_call>{within}</tool_call>").calls) == 1
    score = asyncio.run(ToolCallVerifier().score(request(), gen(f"<tool_call>{deep}</tool_call>")))
    assert score.value == 0.0 and "nested more than" in score.reason


def test_answer_uses_an_upstreams_calls_and_keeps_one_when_parallel_calls_are_off() -> None:
    calls = (ToolCall("a", "get_weather", "{}"), ToolCall("b", "get_time", "{}"))
    assert tools.answer(request(), gen("", calls)).calls == calls
    single = tools.answer(request(parallel_tool_calls=False), gen("", calls))
    assert single.calls == calls[:1] and single.dropped == 1
    # tool_choice none: no tools are shown, and text that looks like a call stays text
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert tools.answer(request(tool_choice="none"), gen(text)).calls == ()


def test_the_content_filter_holds_back_what_may_be_a_call() -> None:
    f = tools.ContentFilter()
    assert [f.feed(p) for p in ["Sure, ", "let me <to", "ol_call>{", '"name"']] == ["Sure, ", "let me ", "", ""]
    f = tools.ContentFilter()
    assert [f.feed(p) for p in ["\n", '{"name": ', '"x"}']] == ["", "", ""]  # may be an untagged call
    f = tools.ContentFilter()
    assert "".join(f.feed(p) for p in ["a < b", " and <", "b>"]) == "a < b and <b>"
    f = tools.ContentFilter()
    assert [f.feed(p) for p in ["``", "`js", "on\n{"]] == ["", "", ""]  # a fenced call
    f = tools.ContentFilter()
    assert [f.feed(p) for p in ["``", "`python\n", "x"]] == ["", "```python\n", "x"]


def test_the_fallback_rendering_teaches_the_tagged_form_and_writes_tool_turns_as_text() -> None:
    req = request(*HISTORY, tool_choice=NamedTool("get_weather"), parallel_tool_calls=False)
    messages, rendered_tools = tools.chat_inputs(req, native=False)
    assert rendered_tools is None
    system = messages[0]
    assert (
        system["role"] == "system" and "<tools>" in system["content"] and '"name": "get_weather"' in system["content"]
    )
    assert "You must call the function get_weather." in system["content"] and "at most one" in system["content"]
    assert tools.parse_tool_calls(messages[2]["content"]).calls[0].name == "get_weather"
    assert messages[3] == {"role": "user", "content": "<tool_response>\n21 C, sunny\n</tool_response>"}
    # tool_choice none: no tools section, the history still rendered
    messages, _ = tools.chat_inputs(request(*HISTORY, tool_choice="none"), native=False)
    assert messages[0]["role"] == "user" and "<tool_call>" in messages[1]["content"]


@pytest.mark.slow
@pytest.mark.skipif(not QWEN.exists(), reason="the Qwen2.5-Coder model is not in the cache")
def test_qwens_own_template_renders_the_tools_and_the_history() -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    model = llama_cpp.Llama(str(QWEN), vocab_only=True, verbose=False)
    template = model.metadata["tokenizer.chat_template"]
    assert tools.template_renders_tools(template)
    messages, offered = tools.chat_inputs(request(*HISTORY), native=True)
    prompt = Jinja2ChatFormatter(template=template, eos_token="", bos_token="")(messages=messages, tools=offered).prompt
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    # the earlier call, arguments as an object (not a JSON string inside a string), and its result
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n21 C, sunny\n</tool_response>" in prompt


def test_call_schema_is_what_a_valid_call_looks_like() -> None:
    schema = tools.call_schema(request(tool_choice=NamedTool("get_weather")))
    assert schema is not None
    assert first_error(schema, {"name": "get_weather", "arguments": {"city": "Paris"}}) is None
    assert first_error(schema, {"name": "get_time", "arguments": {}}) is not None
    assert first_error(schema, {"name": "get_weather", "arguments": {}}) is not None
    both = tools.call_schema(request())
    assert both is not None and len(both["anyOf"]) == 2
    assert tools.call_schema(request(tool_choice="none")) is None


def test_a_conversation_ending_on_tool_results_asks_for_their_use() -> None:
    history = (
        Message("user", "Time in Oslo?"),
        Message("assistant", "", (ToolCall("call_1", "get_time", '{"city": "Oslo"}'),)),
        Message("tool", "14:05", tool_call_id="call_1"),
    )
    spec = ToolSpec("get_time", None, '{"type": "object"}')
    for native in (True, False):
        messages, _ = tools.chat_inputs(GenerationRequest(messages=history, tools=(spec,)), native=native)
        assert messages[-1] == {"role": "user", "content": tools.RESULTS_NUDGE}
        later, _ = tools.chat_inputs(
            GenerationRequest(messages=(*history, Message("user", "Thanks")), tools=(spec,)), native=native
        )
        assert tools.RESULTS_NUDGE not in json.dumps(later)


def test_decode_arguments_says_why_and_never_raises() -> None:
    assert tools.decode_arguments('{"city": "Paris"}') == ({"city": "Paris"}, None)
    assert tools.decode_arguments("[1]") == ([1], None)  # JSON, not an object: the caller decides
    assert tools.decode_arguments("{not json")[1].startswith("not JSON")  # type: ignore[union-attr]
    for depth in (65, 5000):  # past the bound, and past json's own recursion limit
        value, why = tools.decode_arguments("[" * depth + "]" * depth)
        assert value is None and why == f"nested more than {tools.MAX_NESTING} deep"

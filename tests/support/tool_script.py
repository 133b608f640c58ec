"""A backend that answers as a local model using tools does, for the tool-call tests of every
surface (the 135M test model does not call functions on its own).

`ToolScript(name, call)` writes `call` (a `<tool_call>` block, as Qwen-style templates make a model
write one) while the last message is the user's, and a sentence quoting the result once a `tool`
message brings it; in pieces of a few characters, as an engine streams them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.backends.base import Backend
from router.generation import Delta, Generation, GenerationRequest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
GOOD_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "get_wether", "arguments": {"town": "Paris"}}\n</tool_call>'
TOOL_CALL_VERIFIER = '[[tiers.verifiers]]\nname = "tool_call"\n'


class ToolScript(Backend):
    def __init__(self, name: str, call: str) -> None:
        super().__init__(name)
        self.call = call

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        assert request.messages is not None
        last = request.messages[-1]
        text = f"It is {last.content} in Paris." if last.role == "tool" else self.call
        pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
        for piece in pieces:
            yield Delta(piece)
        yield Generation(text, "stop", 20, len(pieces), None, 0.001, model="script")

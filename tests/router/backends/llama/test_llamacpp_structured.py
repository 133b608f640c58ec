"""Constrained decoding and logit shaping in the local engine, on the real SmolLM2 model: answers
under a response_format's grammar are valid JSON for it, greedy and sampled, beside free sequences
in the same decode steps; logit_bias and the penalties change what is sampled."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from router.backends.llama.backend import LlamaCppBackend
from router.config import LlamaCppSettings
from router.errors import RequestError
from router.generation import GenerationRequest, Message, ResponseFormat

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "role": {"enum": ["engineer", "teacher", "doctor"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "skills"],
    "additionalProperties": False,
}
ASK = "Describe a person as JSON with their name, age, role and skills."


@pytest.fixture(scope="module")
async def backend(smol_path: Path):
    b = LlamaCppBackend(
        "small", smol_path, LlamaCppSettings(model=str(smol_path), n_ctx=2048, n_threads=1, n_parallel=4), 512
    )
    await b.start()
    yield b
    await b.close()


def chat(q: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(messages=(Message("user", q),), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_schema_answers_validate(backend: LlamaCppBackend, temperature: float) -> None:
    fmt = ResponseFormat("json_schema", PERSON, "person")
    answers = await asyncio.gather(
        *(
            backend.generate(chat(ASK, max_tokens=160, temperature=temperature, seed=s, response_format=fmt))
            for s in range(3)
        )
    )
    for g in answers:
        assert g.constrained is True
        assert g.finish_reason == "stop", g.text  # the end token came only once the grammar was done
        assert backend.engine.grammar_dead_ends == 0
        jsonschema.validate(_json(g.text), PERSON)


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise AssertionError(f"not JSON ({exc}): {text!r}") from None


async def test_json_object_mode_answers_an_object(backend: LlamaCppBackend) -> None:
    for q in ("What is the capital of France?", "Write a haiku about rain.", "List three colors."):
        g = await backend.generate(chat(q, max_tokens=160, response_format=ResponseFormat("json_object")))
        assert g.finish_reason == "stop", g.text
        assert isinstance(_json(g.text), dict)


async def test_constrained_and_free_sequences_share_a_batch(backend: LlamaCppBackend) -> None:
    fmt = ResponseFormat("json_schema", PERSON, "person")
    free = chat("Name three colors.", max_tokens=32)
    alone = await backend.generate(free)
    steps = backend.engine.steps
    constrained, batched = await asyncio.gather(
        backend.generate(chat(ASK, max_tokens=160, response_format=fmt)), backend.generate(free)
    )
    jsonschema.validate(json.loads(constrained.text), PERSON)
    assert batched.constrained is False and not batched.text.lstrip().startswith("{")
    assert batched.text[:1] == alone.text[:1]
    # one decode step per token of the longer answer, give or take the prompt's: they shared steps
    assert backend.engine.steps - steps < constrained.completion_tokens + batched.completion_tokens


async def test_a_cut_off_answer_is_unfinished_json(backend: LlamaCppBackend) -> None:
    g = await backend.generate(chat(ASK, max_tokens=4, response_format=ResponseFormat("json_schema", PERSON, "p")))
    assert g.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(g.text)


async def test_most_tokens_cost_one_grammar_check(backend: LlamaCppBackend) -> None:
    """The sampled token is usually allowed, so the grammar checks it alone; a scan of the whole
    vocabulary happens only when it is not. (Its time per token is a benchmark's business, not a
    test's: docs/benchmarks.md.)"""
    engine = backend.engine
    engine.grammar_s, engine.grammar_tokens, engine.grammar_full_scans = 0.0, 0, 0
    fmt = ResponseFormat("json_schema", PERSON, "person")
    await asyncio.gather(
        *(backend.generate(chat(ASK, max_tokens=160, temperature=0.7, seed=s, response_format=fmt)) for s in range(4))
    )
    assert engine.grammar_tokens > 0
    assert engine.grammar_full_scans <= engine.grammar_tokens // 10


async def test_a_left_recursive_schema_is_a_bad_request(backend: LlamaCppBackend) -> None:
    looping = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}
    with pytest.raises(RequestError) as err:
        await backend.generate(chat("Hi", response_format=ResponseFormat("json_schema", looping, "loop")))
    assert err.value.param == "response_format"
    assert backend.ready
    assert (await backend.generate(chat("Hi", max_tokens=4))).completion_tokens > 0


async def test_logit_bias_bans_and_forces_tokens(backend: LlamaCppBackend) -> None:
    q = chat("What is the capital of France?", max_tokens=6, top_logprobs=1)
    g = await backend.generate(q)
    first = backend.engine.tokenize(g.text, add_special=False, parse_special=False)[0]
    banned = await backend.generate(q.with_(logit_bias=((first, -100.0),)))
    assert backend.engine.tokenize(banned.text, add_special=False, parse_special=False)[0] != first
    # the logprob reported stays the model's own, not the biased one
    forced_token = backend.engine.tokenize(" banana", add_special=False, parse_special=False)[0]
    forced = await backend.generate(q.with_(logit_bias=((forced_token, 100.0),)))
    assert forced.text.startswith(" banana" * 2)
    assert forced.token_logprobs is not None and forced.token_logprobs[0] < -1.0


async def test_frequency_penalty_breaks_repetition(backend: LlamaCppBackend) -> None:
    q = chat("Repeat the word hello twenty times.", max_tokens=48)
    plain, penalised = (
        await backend.generate(q),
        await backend.generate(q.with_(frequency_penalty=2.0, presence_penalty=1.0)),
    )

    def top_count(text: str) -> int:
        return Counter(backend.engine.tokenize(text, add_special=False, parse_special=False)).most_common(1)[0][1]

    assert top_count(penalised.text) < top_count(plain.text)


async def test_a_token_outside_the_vocabulary_is_a_bad_request(backend: LlamaCppBackend) -> None:
    with pytest.raises(RequestError) as err:
        await backend.generate(chat("Hi", logit_bias=((backend.engine.n_vocab, 1.0),)))
    assert err.value.param == "logit_bias"


async def test_no_raw_control_character_gets_into_a_string(backend: LlamaCppBackend) -> None:
    """JSON forbids a raw newline inside a string; pushed hard towards one (a +100 bias), the
    grammar still keeps it out, and the answer parses."""
    newline = backend.engine.tokenize("\n", add_special=False, parse_special=False)[0]
    fmt = ResponseFormat(
        "json_schema", {"type": "object", "properties": {"poem": {"type": "string"}}, "required": ["poem"]}, "p"
    )
    g = await backend.generate(
        chat("Write a two-line poem.", max_tokens=48, logit_bias=((newline, 100.0),), response_format=fmt)
    )
    assert "\n" not in g.text
    if g.finish_reason == "stop":
        assert isinstance(_json(g.text), dict)

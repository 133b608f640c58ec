"""OpenAI request and response shapes, and their translation to and from our typed values."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from router.cascade import CascadeResult
from router.errors import RequestError
from router.generation import GenerationRequest, Message


class _Lenient(BaseModel):
    # Unknown OpenAI parameters are ignored rather than refused: clients send newer ones freely.
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise RequestError(f"content part of type '{part.type}' is not supported", param="messages")
            texts.append(part.text)
        return "".join(texts)


class TierrouteOptions(_Lenient):
    """Our extension of the request: what the caller can give the verifiers."""

    tests: str | None = Field(None, description="Python test code for the code_tests verifier.")


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Common(_Lenient):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    tierroute: TierrouteOptions | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def metadata(self) -> dict[str, Any]:
        return {"tests": self.tierroute.tests} if self.tierroute and self.tierroute.tests else {}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def to_generation(self, default_max_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            messages=tuple(Message(m.role, m.text()) for m in self.messages),
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stops(),
            metadata=self.metadata(),
        )


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    def to_generation(self, default_max_tokens: int) -> GenerationRequest:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise RequestError("prompt must be one string (batches of prompts are not supported)", param="prompt")
            prompt = prompt[0]
        if self.echo or self.suffix:
            raise RequestError("echo and suffix are not supported", param="echo" if self.echo else "suffix")
        return GenerationRequest(
            prompt=prompt,
            max_tokens=self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stops(),
            metadata=self.metadata(),
        )


# ---- responses ---------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(result: CascadeResult) -> dict[str, int]:
    g = result.generation
    return {
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }


def chat_response(rid: str, result: CascadeResult, extension: dict[str, Any]) -> dict[str, Any]:
    g = result.generation
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.final.tier,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": g.text},
                "finish_reason": g.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage(result),
        "tierroute": extension,
    }


def completion_response(rid: str, result: CascadeResult, extension: dict[str, Any]) -> dict[str, Any]:
    g = result.generation
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": result.final.tier,
        "choices": [{"index": 0, "text": g.text, "finish_reason": g.finish_reason, "logprobs": None}],
        "usage": usage(result),
        "tierroute": extension,
    }


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }


def completion_chunk(rid: str, model: str, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
    }

"""OpenAI's two request bodies (chat and legacy completions), and their translation to the typed
GenerationRequest the cascade serves.

Requests come from untrusted clients, so every field the service acts on is checked here, in
OpenAI's ranges, before anything reaches a backend: a bad value is a 400 naming the parameter
(router.api.errors maps it), never a failure deep inside a model's engine thread. Types are strict
(`"stream": "yes"` is not a boolean, `1.5` is not a token count, `NaN` is not a temperature), and
counts and lengths are capped, so checking, templating and tokenizing one request stay cheap.
Parameters a client sends and we would silently not honour (`top_logprobs` on the legacy
completions endpoint, whose parameter is `logprobs`) are refused by name.

The pieces a request is made of (messages, tools, response_format) are checked in
router.api.request_parts; the answer's shapes are built in router.api.responses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AllowInfNan, Field, Strict, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from router.api.errors import PermissionDenied
from router.api.request_parts import (
    MAX_TOOLS,
    MAX_TOOLS_CHARS,
    ChatMessage,
    Lenient,
    ModelName,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    TierrouteOptions,
    Tool,
    compact_json,
)
from router.errors import RequestError
from router.generation import (
    MAX_CHOICES,
    MAX_TOP_LOGPROBS,
    GenerationRequest,
    Message,
    NamedTool,
    Tenant,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from router.structured.grammars import (
    check_schema,
    check_schema_bytes,
    schema_known,
)

Number = Annotated[float, Strict(), AllowInfNan(False)]  # a JSON number (an int is fine), finite

MAX_MESSAGES = 2048  # OpenAI's own limit on a chat's messages
MAX_TEXT_CHARS = 4_000_000  # one request's messages or prompt: far beyond any tier's context
MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_TOKENS_BOUND = 1 << 20  # beyond any context; each tier caps max_tokens further to its own
MAX_LEGACY_LOGPROBS = 5  # the legacy completions API's bound on `logprobs`
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # OpenAI's seed is a signed 64-bit integer
MAX_LOGIT_BIAS = 300  # OpenAI's bounds on logit_bias: entries, and each bias's magnitude
LOGIT_BIAS_BOUND = 100.0
MAX_CHOICE_TOKENS = 16_384  # n * max_tokens: what one request may ask decoded, all choices together
TOKEN_ID_MAX = (1 << 31) - 1  # a token id beyond any vocabulary is refused by the tier, not here
# Below this temperature sampling is greedy in all but exact ties (any logit gap of 0.01 leaves
# the runner-up under e^-100 of the mass), and dividing logits by it can overflow to NaN; so it
# is served as temperature 0.
GREEDY_BELOW = 1e-4


class BaseRequest(Lenient):
    # Optional parameters also accept null, meaning their default, as OpenAI's API does.
    model: ModelName
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS_BOUND)
    temperature: Number | None = Field(None, ge=0.0, le=2.0)
    top_p: Number | None = Field(None, ge=0.0, le=1.0)
    n: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES)
    seed: StrictInt | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: (
        Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)]
        | None
    ) = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = Field(None, max_length=512)
    tierroute: TierrouteOptions | None = None
    # response_format: enforced (router.structured.grammars on local tiers, passed to remote ones, checked by
    # the format verifier) and read to tell the request's task (router.tasks). tools: read for the task.
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    serves_tools: ClassVar[bool] = True  # the legacy endpoint refuses them: their schemas are never checked

    @field_validator("tools", mode="before")
    @classmethod
    def _count_first(cls, v: Any) -> Any:
        # counted before the items are read: 10,000 tools are refused for their number, unread
        if isinstance(v, list) and len(v) > MAX_TOOLS:
            raise ValueError(f"at most {MAX_TOOLS} tools")
        return v

    logit_bias: dict[StrictStr, Number] | None = None
    presence_penalty: Number | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Number | None = Field(None, ge=-2.0, le=2.0)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        # written to the ledger, and a limit subject on PostgreSQL, whose TEXT takes no NUL: a row
        # that cannot be written would come back first in the writer's retry queue for good. Held
        # to the rule an admin's user names are (router.control.records.check_user): printable text,
        # no control, format or bidi characters, which would reorder or rewrite the report, log and
        # limit lines the name is shown in; and '*' names a team's row for every user
        if v is None:
            return v
        bad = next((i for i, c in enumerate(v) if not c.isprintable()), None)
        if bad is not None:
            raise ValueError(
                f"user must be printable text: no control, format or bidi characters (U+{ord(v[bad]):04X})"
            )
        if v == "*":
            raise ValueError("user '*' is reserved: it names a team's limits for every user")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        for key, bias in v.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= TOKEN_ID_MAX):
                raise ValueError(f"keys are token ids written as strings, not {key[:32]!r}")
            if not -LOGIT_BIAS_BOUND <= bias <= LOGIT_BIAS_BOUND:
                raise ValueError(f"biases are in -{LOGIT_BIAS_BOUND:g}..{LOGIT_BIAS_BOUND:g}, not {bias}")
        return v

    def logprobs_wanted(self) -> int | None:
        """How many alternatives per token the client wants shown; None: no logprobs at all."""
        raise NotImplementedError

    def new_schemas(self) -> list[Any]:
        """The schemas (as `check_schema` will be given them) that making the typed request checks
        and that were not checked before: up to about a second of CPU each, which the API spends
        off the event loop (router.api.schema_checks). Itself on the loop: a digest per schema."""
        self._check_schema_bytes()  # a request over the cap is refused before any of its schemas is read
        todo: list[Any] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
            schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {}
            if not schema_known(schema):
                todo.append(schema)
        for i, tool in enumerate(self.tools or ()) if self.serves_tools else ():
            spec = tool.spec()
            if spec.parameters_json is None:
                continue
            # a strict function's canonical JSON is its check's key already: no encoding again
            if spec.strict:
                if not schema_known(spec.parameters_json):
                    todo.append(spec.parameters)
                continue
            try:
                loose, _, text = tool.loosened(f"tools.{i}.function.parameters")
            except RequestError:
                continue  # refused outright (cheaply) when the typed request is made
            if not schema_known(text):
                todo.append(loose)
        return todo

    def _check_schema_bytes(self) -> None:
        fmt = self.response_format
        schemas: list[Any] = [t.spec().parameters_json for t in self.tools or () if t.function.parameters is not None]
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
            schemas.append(fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {})
        if schemas:
            check_schema_bytes(schemas, "tools" if self.tools else "response_format")

    def decoding(self) -> dict[str, Any]:
        """response_format, logit_bias and the penalties as a GenerationRequest takes them."""
        return {
            "response_format": None if self.response_format is None else self.response_format.typed(),
            "logit_bias": tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items())),
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
        }

    def backend_top_logprobs(self) -> int:
        """What the backend is asked for: one alternative at least, which brings each token's piece."""
        wanted = self.logprobs_wanted()
        return 0 if wanted is None else max(1, wanted)

    def choices(self, max_tokens: int, tier_max_tokens: int) -> int:
        """n, checked against the tokens it asks decoded: n samples of max_tokens each, as the
        tiers cap it (`tier_max_tokens`: the largest tier's cap)."""
        n = self.n or 1
        if n > 1 and n * min(max_tokens, tier_max_tokens) > MAX_CHOICE_TOKENS:
            raise RequestError(
                f"n * max_tokens may be at most {MAX_CHOICE_TOKENS} (n={n}, max_tokens={max_tokens})", param="n"
            )
        return n

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self) -> dict[str, Any]:
        """temperature, top_p and seed as a GenerationRequest takes them: defaults for nulls, and
        tiny temperatures as the greedy decoding they amount to."""
        temperature = self.temperature or 0.0
        return {
            "temperature": 0.0 if temperature < GREEDY_BELOW else temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "seed": self.seed,
        }

    def metadata(self, may_send_tests: bool) -> dict[str, Any]:
        """What the verifiers may use. Client tests are code the service runs on its host: only a
        caller the operator allowed may send them (403 otherwise, rather than dropping them, so a
        caller never mistakes an unchecked answer for a tested one)."""
        # the verifiers learn whether this caller may have code run at all: without it, `code_tests`
        # runs only the prompt's examples that call a function with literal arguments
        allowed: dict[str, Any] = {"client_code": True} if may_send_tests else {}
        if self.response_format is not None and self.response_format.type != "text":
            allowed["response_format"] = self.response_format.type
        if self.tools:
            allowed["tools"] = len(self.tools)
        if self.tierroute is None or not self.tierroute.carries_tests():
            return allowed
        if not may_send_tests:
            raise PermissionDenied(
                "This caller may not send tierroute.tests (code the server would run). An operator allows "
                "it per API key (`tierroute keys create NAME --allow-tests`), or for every client of a "
                "server without keys (server.allow_client_tests_without_keys).",
                param="tierroute.tests",
                code="tests_not_allowed",
            )
        return {**allowed, "tests": self.tierroute.tests}

    @staticmethod
    def _check_text_size(total: int, param: str) -> None:
        if total > MAX_TEXT_CHARS:
            raise RequestError(f"at most {MAX_TEXT_CHARS} characters of text in one request", param=param)


class ChatCompletionRequest(BaseRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS_BOUND)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # read by _tool_choice: a plain union's error would name the member pydantic tried, not the field
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    # OpenAI parameters that change the answer and that tierroute does not serve: a 400 naming the
    # parameter, so a client never takes an answer for one made as it asked (README, HTTP API)
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None

    @field_validator(
        "functions", "function_call", "audio", "prediction", "web_search_options", "reasoning_effort", "verbosity"
    )
    @classmethod
    def _not_served(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("not supported by tierroute (functions: use tools)")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v is not None and v != ["text"]:
            raise ValueError('only ["text"] is supported')
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Literal["auto", "none", "required"] | NamedToolChoice | None:
        if v is None or v in ("auto", "none", "required"):
            return v  # type: ignore[no-any-return]
        if isinstance(v, dict):
            try:
                return NamedToolChoice.model_validate(v)
            except ValidationError as exc:
                shape = "{'type': 'function', 'function': {'name': ...}}"
                raise ValueError(f"a named tool_choice is {shape} ({exc.errors()[0]['msg']})") from None
        raise ValueError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"
        )

    def logprobs_wanted(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            # as OpenAI: alternatives without the tokens they are alternatives to mean nothing
            raise RequestError("logprobs must be set to true if top_logprobs is used", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def to_generation(
        self, default_max_tokens: int, *, may_send_tests: bool = False, tenant: Tenant | None = None
    ) -> GenerationRequest:
        """The typed request. `may_send_tests` is the caller's permission (Principal.may_send_tests):
        without it a request carrying tierroute.tests is refused with 403. `tenant` is the caller
        (Principal.tenant): whose prompt KV a local tier may reuse for it."""
        self._check_schema_bytes()  # before any of them is checked
        messages = self._messages()
        self._check_text_size(
            sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages), "messages"
        )
        tools, choice = self._tools()
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return GenerationRequest(
            messages=messages,
            n=self.choices(max_tokens, default_max_tokens),
            max_tokens=max_tokens,
            stop=self.stops(),
            top_logprobs=self.backend_top_logprobs(),
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            metadata=self.metadata(may_send_tests),
            tenant=tenant,
            **self.sampling(),
            **self.decoding(),
        )

    def _messages(self) -> tuple[Message, ...]:
        """The history, with its tool turns checked as OpenAI checks them: calls only from the
        assistant, and every tool result answering a call made before it."""
        out: list[Message] = []
        called: set[str] = set()
        for i, m in enumerate(self.messages):
            calls: tuple[ToolCall, ...] = ()
            if m.tool_calls:
                if m.role != "assistant":
                    raise RequestError("only assistant messages carry tool_calls", param=f"messages.{i}.tool_calls")
                calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls)
                called.update(c.id for c in calls)
            if m.role == "tool":
                if m.tool_call_id is None:
                    raise RequestError(
                        "a tool message needs the tool_call_id of the call it answers",
                        param=f"messages.{i}.tool_call_id",
                    )
                if m.tool_call_id not in called:
                    raise RequestError(
                        "a tool message must answer a tool call of an earlier assistant message "
                        f"(no call has id {m.tool_call_id[:64]!r})",
                        param=f"messages.{i}.tool_call_id",
                    )
            elif m.tool_call_id is not None:
                raise RequestError("only tool messages carry tool_call_id", param=f"messages.{i}.tool_call_id")
            out.append(Message(m.role, m.text(), calls, m.tool_call_id if m.role == "tool" else None))
        return tuple(out)

    def _tools(self) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
        specs = tuple(t.spec() for t in self.tools or ())
        if tools_chars(specs) > MAX_TOOLS_CHARS:
            raise RequestError(f"at most {MAX_TOOLS_CHARS} characters of tools, as JSON", param="tools")
        # the check a response_format schema gets: a forced call's arguments are decoded under a
        # grammar of its schema, and every call's are validated against it (verifiers.tool_call).
        # A non-strict function's schema is a hint, as at OpenAI: what the grammar cannot honour is
        # taken out of the schema enforced here, not refused (router.structured.grammars.loosened_form)
        checked: list[ToolSpec] = []
        for i, (tool, spec) in enumerate(zip(self.tools or (), specs, strict=True)):
            param = f"tools.{i}.function.parameters"
            if spec.parameters is not None and spec.strict:
                check_schema(spec.parameters, param=param, text=spec.parameters_json)
            elif spec.parameters is not None:
                loose, dropped, text = tool.loosened(param)
                check_schema(loose, param, text=text)
                if dropped:
                    spec = dataclasses.replace(spec, checked_json=text)
            checked.append(spec)
        specs = tuple(checked)
        choice = self.tool_choice
        if choice is None or choice == "auto":
            return specs, "auto"
        if choice == "none":
            return specs, "none"
        if not specs:
            raise RequestError("tool_choice is only allowed when tools are specified", param="tool_choice")
        if choice == "required":
            return specs, "required"
        assert isinstance(choice, NamedToolChoice)
        if choice.function.name not in {t.name for t in specs}:
            raise RequestError(
                f"tool_choice names the function {choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        return specs, NamedTool(choice.function.name)


def tools_chars(specs: Sequence[ToolSpec]) -> int:
    """len(compact_json([t.to_openai() for t in specs])), each function's parameters counted by
    their compact JSON, which the spec holds already, rather than encoded again: this runs on the
    event loop for every request, and the schemas are most of what its tools weigh."""
    total = 2 + max(len(specs) - 1, 0)  # the brackets and the commas between tools
    for spec in specs:
        tool = spec.to_openai()
        if spec.parameters_json is not None:
            tool["function"]["parameters"] = 0  # one character where the schema's text goes
            total += len(spec.parameters_json) - 1
        total += len(compact_json(tool))
    return total


class CompletionRequest(BaseRequest):
    serves_tools: ClassVar[bool] = False
    prompt: StrictStr | list[StrictStr]
    echo: StrictBool | None = False
    suffix: StrictStr | None = None
    # the legacy API's count of top alternatives; 0 gives the sampled tokens' logprobs alone
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LEGACY_LOGPROBS)
    top_logprobs: Any = None  # chat's parameter: refused here by name rather than ignored
    best_of: Any = None  # several candidates server-side: not served (1 or null only)

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or v != 1):
            raise ValueError("only best_of=1 is supported")
        return v

    def logprobs_wanted(self) -> int | None:
        if self.top_logprobs is not None:
            raise RequestError(
                f"top_logprobs is a chat parameter; on /v1/completions use logprobs (0 to {MAX_LEGACY_LOGPROBS})",
                param="top_logprobs",
            )
        return self.logprobs

    def to_generation(
        self, default_max_tokens: int, *, may_send_tests: bool = False, tenant: Tenant | None = None
    ) -> GenerationRequest:
        """The typed request; `may_send_tests` and `tenant` as for chat."""
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise RequestError("prompt must be one string (batches of prompts are not supported)", param="prompt")
            prompt = prompt[0]
        if self.tools:
            raise RequestError("tools are a chat parameter; use /v1/chat/completions", param="tools")
        if self.echo or self.suffix:
            raise RequestError("echo and suffix are not supported", param="echo" if self.echo else "suffix")
        self._check_schema_bytes()
        self._check_text_size(len(prompt), "prompt")
        max_tokens = self.max_tokens or default_max_tokens
        return GenerationRequest(
            prompt=prompt,
            n=self.choices(max_tokens, default_max_tokens),
            max_tokens=max_tokens,
            stop=self.stops(),
            top_logprobs=self.backend_top_logprobs(),
            metadata=self.metadata(may_send_tests),
            tenant=tenant,
            **self.sampling(),
            **self.decoding(),
        )

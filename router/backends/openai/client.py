"""The SDK client an `openai` tier talks through, over a transport that bounds every byte it reads.

- Size. Every response passes through `upstream_io.CappedTransport`, the httpx transport under the
  SDK's client. It asks for `Accept-Encoding: identity` and refuses a compressed body (its size on
  the wire says nothing of its size in memory), refuses a `Content-Length` over
  `max_response_bytes`, and stops reading at that many bytes. The transport is the one place every
  byte passes: a body, a stream, and the error bodies the SDK reads on its own before we see them.
  An httpx event hook sees a response before its body is read and cannot bound the read; reading
  the raw response at our call sites would leave the SDK's own reads of error bodies unbounded. Too
  much is an upstream failure, tried again only at another deployment of the tier.
- Retries. The SDK's own are off: the backend's `RetryPolicy` decides, within the deadline.
- Redirects are not followed: an API that redirects a POST is misconfigured, and following it
  would send the request where the operator did not point the tier.
- A client given a transport neither sizes its pool nor reads proxy settings from the environment:
  both are said here, as the SDK's own client would have them.
- Headers. Each deployment is sent its own key and nothing the SDK would read from the process's
  environment (OPENAI_CUSTOM_HEADERS, OPENAI_ORG_ID, OPENAI_PROJECT_ID): those would go to every
  host of every tier, and an `Authorization` among them would replace each deployment's key.
- The request path. A completion is sent by `post`, not by the SDK's `create`: `create` walks every
  argument against the SDK's TypedDicts and rebuilds its headers, URL and options on every call,
  about 0.6 ms of CPU a request (half the router's time against an instant upstream, issue 45).
  `post` sends the same body with the same headers (the client's own, computed once per client)
  through the same httpx client and capped transport, and fails as `create` does: a status other
  than 2xx is the SDK's own `APIStatusError` subclass, made from the response by the SDK, and what
  httpx raises is wrapped in `APITimeoutError` or `APIConnectionError`, chained.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx2
import openai

from router.backends.openai.call import Call
from router.backends.openai.upstream_io import CappedTransport, environment_proxy, json_object
from router.errors import ConfigError

if TYPE_CHECKING:
    from router.config import DeploymentSettings, OpenAIBackendSettings


def new_client(
    config: OpenAIBackendSettings, deployment: DeploymentSettings, *, tier: str, timeout_s: float
) -> openai.AsyncOpenAI:
    """The SDK's client for one deployment of a tier, every response read through the capped transport."""
    inner = httpx2.AsyncHTTPTransport(
        limits=httpx2.Limits(max_connections=1000, max_keepalive_connections=100),
        proxy=environment_proxy(deployment.base_url),
    )
    transport = CappedTransport(
        inner,
        max_bytes=config.max_response_bytes,
        # a stream's events each arrive in a piece or two; a plain body in a few
        max_reads=2 * config.max_stream_events + 64,
    )
    key = api_key(deployment, tier=tier)
    http = openai.DefaultAsyncHttpxClient(transport=transport, follow_redirects=False)
    client = openai.AsyncOpenAI(
        base_url=deployment.base_url,
        api_key=key,
        max_retries=0,  # tenacity decides, within the deadline
        timeout=timeout_s,
        http_client=http,
        default_headers=_only_ours(key),
    )
    _WIRES[client] = _Wire(http)
    return client


@dataclass
class _Wire:
    """What `post` needs of a client, worked out once: its httpx client, base URL and headers."""

    http: httpx2.AsyncClient
    base: str = ""
    headers: dict[str, str] | None = None

    def prepared(self, client: openai.AsyncOpenAI) -> dict[str, str]:
        if self.headers is None:
            self.base = str(client.base_url).rstrip("/") + "/"
            # the SDK's own headers, as `create` sends them: its defaults, ours over them (the
            # deployment's key; the environment's headers removed: `openai.Omit`)
            merged = {**client.auth_headers, **client.default_headers}
            self.headers = {k: v for k, v in merged.items() if isinstance(v, str)}
        return self.headers


_WIRES: weakref.WeakKeyDictionary[openai.AsyncOpenAI, _Wire] = weakref.WeakKeyDictionary()


@dataclass
class Sent:
    """A response whose body is still unread, as the SDK's streaming response gives it."""

    http_response: httpx2.Response

    async def read(self) -> bytes:
        return await self.http_response.aread()

    async def close(self) -> None:
        await self.http_response.aclose()


def _request_errors() -> tuple[type[BaseException], ...]:
    import anyio

    return (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)


async def post(
    client: openai.AsyncOpenAI,
    path: str,
    params: Mapping[str, Any],
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> Sent:
    """One completion request of `params` (the SDK's arguments: `extra_body` merged into the body)
    at `path` under the client's base URL, its body unread; fails as the SDK's `create` does (the
    module's docstring)."""
    wire = _WIRES.get(client)
    if wire is None:  # a client this module did not make: the SDK's own way
        raise RuntimeError("post: not a client made by new_client")
    sent_headers = wire.prepared(client)
    if headers:
        sent_headers = {**sent_headers, **headers}
    body = {k: v for k, v in params.items() if k != "extra_body"}
    extra = params.get("extra_body")
    if extra:
        body.update(extra)
    request = httpx2.Request(
        "POST",
        wire.base + path.lstrip("/"),
        headers=sent_headers,
        content=json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8"),
        extensions={"timeout": httpx2.Timeout(timeout_s).as_dict()},
    )
    try:
        response = await wire.http.send(request, stream=True)
    except httpx2.TimeoutException as err:
        raise openai.APITimeoutError(request=request) from err
    except openai.OpenAIError:
        raise
    except _request_errors() as err:
        raise openai.APIConnectionError(request=request) from err
    if not 200 <= response.status_code < 300:  # as the SDK's raise_for_status: a redirect too
        try:
            await response.aread()  # the error body, through the capped transport
        except BaseException:
            with contextlib.suppress(Exception):
                await response.aclose()
            raise
        raise client._make_status_error_from_response(response) from None
    return Sent(response)


# Headers the SDK would take from the process's environment and send to every server: its
# organization and project, and whatever OPENAI_CUSTOM_HEADERS lists, an `Authorization` included.
_AMBIENT_ENV = {"OPENAI_ORG_ID": "OpenAI-Organization", "OPENAI_PROJECT_ID": "OpenAI-Project"}


def _only_ours(key: str) -> Mapping[str, str]:
    """The client's own headers: this deployment's key, and the SDK's environment headers left out
    (`openai.Omit` removes a header). Without this an `Authorization:` in OPENAI_CUSTOM_HEADERS
    replaced every deployment's key with one ambient secret sent to every host, and the operator's
    organization went to hosts that are not OpenAI's."""
    headers: dict[str, Any] = {name: openai.Omit() for name in _AMBIENT_ENV.values()}
    for line in os.environ.get("OPENAI_CUSTOM_HEADERS", "").split("\n"):
        name, colon, _ = line.partition(":")
        if colon and name.strip():
            headers[name.strip()] = openai.Omit()
    headers["Authorization"] = f"Bearer {key}"
    return headers


def missing_key(deployment: DeploymentSettings) -> str | None:
    """The environment variable the deployment's key should be in, when it is not set (or empty)."""
    env = deployment.api_key_env
    return env if env is not None and not os.environ.get(env) else None


def api_key(deployment: DeploymentSettings, *, tier: str) -> str:
    env = deployment.api_key_env
    if env is None:
        return "not-needed"  # the SDK insists on a key; local servers ignore it
    key = os.environ.get(env)
    if not key:
        raise ConfigError(f"tier {tier}: tiers.openai.api_key_env names {env}, which is not set")
    return key


async def json_body(response: Any, call: Call) -> dict[str, Any]:
    """The whole body of a response (through the capped transport, within the call's deadline),
    closed after, as one JSON object. A JSON body is UTF-8 (RFC 8259); what is not becomes U+FFFD
    rather than a failure."""
    try:
        async with asyncio.timeout(call.remaining()):
            body = await response.read()
    finally:
        await close_quietly(response)
    return json_object(body.decode("utf-8", "replace"))


async def close_quietly(response: Any) -> None:
    # Closing a broken stream may fail again; the first error is the one to keep.
    with contextlib.suppress(Exception):
        await response.close()

"""httpx's one-call functions for tests that speak plain HTTP to their own servers on 127.0.0.1,
without the TLS set-up each call would otherwise repeat.

`httpx.get` and the like build a client per call, and every client loads certifi's CA bundle into
a new SSL context: about 40 ms of CPU, more than the server spends answering most of the requests
a test sends (a hostile-request module sends hundreds). The tests never speak TLS, so one context,
built once, serves every call; each call still opens and closes its own connection, as
`httpx.get` does, so no test's request shares a connection with another's."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

_TLS = ssl.create_default_context()  # what httpx would build per call; unused by http:// URLs


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, verify=_TLS, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


@contextmanager
def stream(method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
    with httpx.stream(method, url, verify=_TLS, **kwargs) as response:
        yield response


def share_default_tls() -> None:
    """Build the HTTP clients' default TLS context once per process, not once per client.

    The tests make thousands of clients (`httpx.Client`, `httpx.AsyncClient`, and the official
    `openai` clients, which sit on httpx or, in newer releases, on its successor `httpx2`), and each
    loads certifi's bundle into a new SSL context: ~25 ms of CPU a client, measured, where the
    requests they send to 127.0.0.1 never use it. A context with the default settings
    (`verify=True`, no client certificate) is made once and shared, as a context may be; any other
    settings build their own as before. Both libraries bind the function by name in their transport
    module, which is where it is replaced; if httpx moves it, this fails loudly."""
    import importlib

    for name in ("httpx._transports.default", "httpx2._transports.default"):
        try:
            transport = importlib.import_module(name)
        except ModuleNotFoundError:
            if name.startswith("httpx."):
                raise
            continue  # an openai release on httpx itself
        _share(transport)


def _share(transport: Any) -> None:
    build = transport.create_ssl_context
    if getattr(build, "shared_default", False):
        return
    made: dict[bool, ssl.SSLContext] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env)  # type: ignore[no-any-return]
        if trust_env not in made:
            made[trust_env] = build(verify=verify, cert=cert, trust_env=trust_env)
        return made[trust_env]

    create_ssl_context.shared_default = True  # type: ignore[attr-defined]
    transport.create_ssl_context = create_ssl_context

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

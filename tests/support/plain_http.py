"""One TLS context for the tests' HTTP clients, built once per process, not once per client.

`httpx.get` and the like, `httpx.Client`, `httpx.AsyncClient` and the official `openai` clients
each load certifi's CA bundle into a new SSL context: about 25 ms of CPU a client, more than the
server spends answering most of the requests a test sends to 127.0.0.1 over plain HTTP. The tests
make thousands; `tests/conftest.py` calls `share_default_tls` once per worker."""

from __future__ import annotations

import ssl
from typing import Any


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

"""The worker: the program that runs inside the sandbox and answers the checker's requests.

It is shipped to the box as source text: `worker_source` is `_worker_main`'s own source
(`inspect.getsource`) and one line that calls it. The box sees only the standard library, so the
function is self-contained: it imports what it needs inside its body and never this package (nor
anything of this module's top level). It decides nothing: it reports whether the code raised, what
it printed and the value, as plain data (`verifiers.code_tests.protocol` reads it as hostile).
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from typing import Any


@functools.cache
def worker_source() -> str:
    # annotations stay strings in the box, where typing is not imported
    return (
        "from __future__ import annotations\n" + textwrap.dedent(inspect.getsource(_worker_main)) + "\n_worker_main()\n"
    )


def _worker_main() -> None:  # pragma: no cover - runs only inside the sandbox
    """Load solution.py as module ``solution``, then answer requests from stdin, one JSON line each.

    Shipped to the sandbox as source text; self-contained. It decides nothing: it reports whether
    the code raised, what it printed and the value, as plain data (see the module docstring).
    """
    import contextlib
    import io
    import json
    import os
    import sys
    import types

    max_printed, max_nodes, max_reply = 16384, 50000, 900_000
    out_fd = os.dup(1)
    requests = sys.stdin.buffer

    def send(reply: dict[str, Any]) -> None:
        try:
            data = (json.dumps(reply) + "\n").encode()
        except (TypeError, ValueError):
            data = (json.dumps({"id": reply["id"], "ok": False, "exc": "EncodingError", "msg": ""}) + "\n").encode()
        if len(data) > max_reply:  # the checker refuses longer lines as out of protocol
            reply = {**reply, "printed": reply.get("printed", "")[:1000]}
            if "value" in reply:
                reply["value"] = {"t": "o", "type": "too_big", "repr": "<too big>"}
            data = (json.dumps(reply) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out_fd, view) :]

    def encode(value: Any, budget: list[int], depth: int = 0) -> dict[str, Any]:
        budget[0] -= 1
        t = type(value)
        if budget[0] < 0 or depth > 90:
            return {"t": "o", "type": "too_big", "repr": "<too big>"}
        if value is None:
            return {"t": "n"}
        if t is bool:
            return {"t": "B", "v": value}
        if t is int:
            try:
                return {"t": "i", "v": str(value)}
            except ValueError:
                return {"t": "o", "type": "int", "repr": "<int too long>"}
        if t is float:
            return {"t": "f", "v": repr(value)}
        if t is complex:
            return {"t": "x", "v": [repr(value.real), repr(value.imag)]}
        if t is str:
            return {"t": "s", "v": value}
        if t is bytes:
            return {"t": "b", "v": value.hex()}
        tags: dict[Any, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
        if t in tags:
            return {"t": tags[t], "v": [encode(x, budget, depth + 1) for x in value]}
        if t is dict:
            pairs = [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in value.items()]
            return {"t": "d", "v": pairs}
        try:
            text = repr(value)[:1000]
        except BaseException:  # noqa: BLE001 - a repr that fails is still a value to describe
            text = "<unrepresentable>"
        return {"t": "o", "type": t.__name__[:100], "repr": text}

    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    spaces: dict[str, dict[str, Any]] = {}
    while True:
        line = requests.readline()
        if not line:
            return
        request = json.loads(line)
        rid = request["id"]
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                if request["op"] == "load":
                    with open("solution.py", encoding="utf-8") as fh:
                        code = compile(fh.read(), module.__file__, "exec")
                    exec(code, module.__dict__)  # noqa: S102 - that is the job
                    value = None
                else:
                    ns = spaces.get(request["ns"])
                    if ns is None:
                        base = spaces.get(request.get("base") or "")
                        ns = spaces[request["ns"]] = dict(base if base is not None else module.__dict__)
                        if base is None:
                            ns["__name__"] = "__test__"
                    mode = "eval" if request["op"] == "eval" else "exec"
                    value = eval(compile(request["source"], "<test>", mode), ns)  # noqa: S307
            reply = {"id": rid, "ok": True, "printed": printed.getvalue()[:max_printed]}
            reply["value"] = encode(value, [max_nodes])
            try:
                reply["truth"] = bool(value)
            except BaseException:  # noqa: BLE001
                reply["truth"] = None
        except BaseException as exc:  # noqa: BLE001 - a test's failure, whatever it is, is data
            try:
                text = str(exc)[:300]
            except BaseException:  # noqa: BLE001
                text = ""
            reply = {
                "id": rid,
                "ok": False,
                "printed": printed.getvalue()[:max_printed],
                "exc": type(exc).__name__[:100],
                "msg": text,
            }
        send(reply)

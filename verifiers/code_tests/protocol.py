"""The checker's end of the wire to the worker in the box: one request, one plain-data reply.

Who decides a test passed. The answer's code runs first in its process and can take that process
over (replace functions, read every frame, write to any descriptor, exit). So the process that runs
it only *reports*, and the checker, outside the sandbox, decides. The worker in the sandbox
(`verifiers.code_tests.worker`) answers one request at a time on a pipe; each request carries a
fresh random id that the answer must echo, so replies cannot be written ahead; a reply is plain
data: whether the code raised (and the exception's type name), what it printed, and the value of an
expression as a tagged tree of numbers, strings, bytes, lists, tuples, sets and dicts (anything else
is "an object", which equals nothing). The expectation never enters the sandbox.

Everything read here is the box's, so it is read as hostile: a reply longer than
`MAX_REPLY_BYTES`, not echoing the id, or malformed anywhere stops the run as ``forged`` (`Stop`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from verifiers import outside_judge
from verifiers.outside_judge import Opaque

MAX_REPLY_BYTES = 1 << 20  # one reply line; the box's stream reader refuses a longer one


class _BadReply(ValueError):
    pass


# Rebuilding a set or dict hashes every item while the GIL is held: values crafted to collide
# (ints equal modulo 2**61 - 1) make that quadratic and stall every thread, the event loop included;
# with the reply size capped, 256 per container bounds the whole decode to a few million comparisons.
MAX_HASHED_ITEMS = outside_judge.MAX_HASHED_ITEMS


def decode_value(tree: Any, depth: int = 0) -> Any:
    """Rebuild a tagged value sent by the worker; anything malformed raises _BadReply."""
    if depth > 100 or not isinstance(tree, dict):
        raise _BadReply("malformed value")
    tag, v = tree.get("t"), tree.get("v")
    try:
        if tag == "n":
            return None
        if tag == "B" and isinstance(v, bool):
            return v
        if tag == "i" and isinstance(v, str) and len(v) <= 5000:
            return int(v)
        if tag == "f" and isinstance(v, str) and len(v) <= 64:
            return float(v)
        if tag == "x" and isinstance(v, list) and len(v) == 2 and all(isinstance(p, str) and len(p) <= 64 for p in v):
            return complex(float(v[0]), float(v[1]))
        if tag == "s" and isinstance(v, str):
            return v
        if tag == "b" and isinstance(v, str):
            return bytes.fromhex(v)
        if tag in ("l", "t", "S", "F") and isinstance(v, list):
            if tag in ("S", "F") and len(v) > MAX_HASHED_ITEMS:
                raise _BadReply("set too large")
            items = [decode_value(x, depth + 1) for x in v]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and isinstance(v, list):
            if len(v) > MAX_HASHED_ITEMS:
                raise _BadReply("dict too large")
            out = {}
            for pair in v:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _BadReply("malformed dict")
                out[decode_value(pair[0], depth + 1)] = decode_value(pair[1], depth + 1)
            return out
        if tag == "o" and isinstance(tree.get("type"), str) and isinstance(tree.get("repr"), str):
            return Opaque(tree["type"][:100], tree["repr"][:1000])
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise _BadReply("malformed value") from exc
    raise _BadReply("malformed value")


@dataclass(frozen=True)
class Reply:
    ok: bool
    value: Any = None
    truth: bool | None = None
    printed: str = ""
    exc: str = ""  # the exception's type name, as the worker said (log only)
    msg: str = ""  # its message (log only)


class Stop(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind, self.detail = kind, detail


class Session:
    """Request and reply, one at a time; a reply must echo the request's random id."""

    def __init__(self, box: Any, deadline: float, unit_timeout_s: float) -> None:
        self.box, self.deadline, self.unit_timeout_s = box, deadline, unit_timeout_s

    async def ask(self, request: dict[str, Any]) -> Reply:
        rid = secrets.token_hex(12)
        line = json.dumps({**request, "id": rid}) + "\n"
        wait = min(self.unit_timeout_s, self.deadline - time.monotonic())
        if wait <= 0:
            raise Stop("timeout")
        try:
            self.box.stdin.write(line.encode())
            await asyncio.wait_for(self.box.stdin.drain(), wait)
            raw = await asyncio.wait_for(self.box.stdout.readline(), wait)
        except TimeoutError:
            raise Stop("timeout") from None
        except (BrokenPipeError, ConnectionResetError):
            raise Stop("crashed") from None
        except ValueError:  # a line beyond the stream's limit
            raise Stop("forged", "reply too long") from None
        if not raw:
            raise Stop("crashed", "the worker ended")
        if not raw.endswith(b"\n"):
            raise Stop("crashed", "the worker ended mid-reply")
        return await asyncio.to_thread(_parse_reply, raw, rid)


def _parse_reply(raw: bytes, rid: str) -> Reply:
    try:
        msg = json.loads(raw)
        if not isinstance(msg, dict) or msg.get("id") != rid or not isinstance(msg.get("ok"), bool):
            raise _BadReply("not a reply to this request")
        printed = msg.get("printed", "")
        exc, text = msg.get("exc", ""), msg.get("msg", "")
        truth = msg.get("truth")
        if not isinstance(printed, str) or not isinstance(exc, str) or not isinstance(text, str):
            raise _BadReply("malformed reply")
        if truth is not None and not isinstance(truth, bool):
            raise _BadReply("malformed reply")
        value = decode_value(msg["value"]) if msg["ok"] and "value" in msg else None
        return Reply(msg["ok"], value, truth, printed, exc[:100], text[:300])
    except (ValueError, RecursionError, KeyError) as exc:  # _BadReply and json errors are ValueErrors
        raise Stop("forged", f"reply out of protocol: {exc}") from None

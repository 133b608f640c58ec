"""Finished spans to the bytes of an OTLP `ExportTraceServiceRequest`, written directly.

OpenTelemetry's own encoder builds a protobuf message object per span, per attribute and per
value, through several Python calls each, and groups spans by hashing their resource, whose hash
is a JSON dump of its attributes, computed again for every span. Exporting every span of a request
that way cost about 86 µs of CPU per span here, two thirds of what tracing cost the service
(docs/telemetry.md, Overhead). This module writes the same message straight to protobuf's wire
format: the same fields, values and grouping, so a collector decodes the same request (a test
parses both and compares them), at a fraction of the work: keys are encoded once, resources and
scopes are grouped by identity (one provider has one of each), and nothing is built only to be
serialised.

The encoder takes what the SDK's `ReadableSpan` offers (plain attributes, events, links, status)
and nothing of tierroute. An attribute whose value cannot be encoded (an integer outside int64,
an unknown type) is left out with a log line, as OpenTelemetry's encoder does.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

_DOUBLE = struct.Struct("<d").pack
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_SMALL = [bytes((n,)) for n in range(128)]
_INT64 = 1 << 63
# span flags: the context's remote-ness is known (0x100), and the parent is remote (0x200)
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_KEYS: dict[str, bytes] = {}  # a KeyValue's key field, per key: a small, fixed vocabulary
_KEYS_MAX = 4096  # an instrumented library could bring its own keys; the caches stay bounded
# whole KeyValues of short text and flags, per (key, value): the same few recur on every request
# (bool values never meet an int's entry here: only str and bool values are looked up)
_WORDS: dict[tuple[str, Any], bytes] = {}
_WORD_BYTES = 96


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64  # int64 as protobuf writes it: ten bytes of two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return tag + _varint(len(payload)) + payload


def _value(v: Any) -> bytes:
    """An AnyValue's fields. A oneof member is written even when it is the default (False, 0, "")."""
    t = type(v)
    if t is str:
        return _field(b"\x0a", v.encode("utf-8"))
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if t is int:
        if not -_INT64 <= v < _INT64:
            raise ValueError(f"{v} is outside int64")
        return b"\x18" + _varint(v)
    if t is float:
        return b"\x21" + _DOUBLE(v)
    if v is None:
        return b""
    # subclasses (an IntEnum, a str enum), in the order OpenTelemetry's encoder checks them
    if isinstance(v, bool):
        return _value(bool(v))
    if isinstance(v, str):
        return _value(str(v))
    if isinstance(v, int):
        return _value(int(v))
    if isinstance(v, float):
        return _value(float(v))
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _value(x)) for x in v]))
    if isinstance(v, Mapping):
        return _field(b"\x32", b"".join([_field(b"\x0a", _key_value(str(k), x)) for k, x in v.items()]))
    raise TypeError(f"invalid type {type(v).__name__} of an attribute value")


def _key_value(key: str, value: Any) -> bytes:
    t = type(value)
    if t is str or t is bool:  # names, models, decisions: a few values each, encoded once
        cached = _WORDS.get((key, value))
        if cached is not None:
            return cached
    head = _KEYS.get(key)
    if head is None:
        head = _field(b"\x0a", key.encode("utf-8")) if key else b""
        if len(_KEYS) < _KEYS_MAX:
            _KEYS[key] = head
    encoded = head + _field(b"\x12", _value(value))
    if (t is str or t is bool) and len(_WORDS) < _KEYS_MAX and len(encoded) <= _WORD_BYTES:
        _WORDS[(key, value)] = encoded
    return encoded


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    out = []
    for key, value in (attributes or {}).items():
        try:
            out.append(_field(tag, _key_value(key, value)))
        except (TypeError, ValueError) as exc:
            log.warning("span attribute %s not exported: %s", key, exc)
    return out


def _count(tag: bytes, n: int) -> bytes:
    return tag + _varint(n) if n else b""


def _span(span: Any) -> bytes:
    ctx = span.context
    parent = span.parent
    parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"), b"\x12\x08" + ctx.span_id.to_bytes(8, "big")]
    if ctx.trace_state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()).encode("utf-8")))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_field(b"\x2a", span.name.encode("utf-8")))
    parts.append(b"\x30" + _varint(span.kind.value + 1))  # OTLP's kinds count from 1 (0: unspecified)
    if span.start_time:
        parts.append(b"\x39" + _FIXED64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _FIXED64(span.end_time))
    parts += _attributes(b"\x4a", span.attributes)
    parts.append(_count(b"\x50", span.dropped_attributes))
    for event in span.events:
        body = [b"\x09" + _FIXED64(event.timestamp)] if event.timestamp else []
        if event.name:
            body.append(_field(b"\x12", event.name.encode("utf-8")))
        body += _attributes(b"\x1a", event.attributes)
        body.append(_count(b"\x20", event.dropped_attributes))
        parts.append(_field(b"\x5a", b"".join(body)))
    parts.append(_count(b"\x60", span.dropped_events))
    for link in span.links:
        lc = link.context
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if lc.is_remote else 0)
        body = [b"\x0a\x10" + lc.trace_id.to_bytes(16, "big"), b"\x12\x08" + lc.span_id.to_bytes(8, "big")]
        body += _attributes(b"\x22", link.attributes)
        body += [_count(b"\x28", link.dropped_attributes), b"\x35" + _FIXED32(flags)]
        parts.append(_field(b"\x6a", b"".join(body)))
    parts.append(_count(b"\x70", span.dropped_links))
    status = span.status
    message = _field(b"\x12", status.description.encode("utf-8")) if status.description else b""
    parts.append(_field(b"\x7a", message + _count(b"\x18", status.status_code.value)))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    parts.append(b"\x85\x01" + _FIXED32(flags))
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = [_field(b"\x0a", scope.name.encode("utf-8"))] if scope.name else []
    if scope.version:
        parts.append(_field(b"\x12", scope.version.encode("utf-8")))
    parts += _attributes(b"\x1a", scope.attributes)
    return b"".join(parts)


def encode_spans(spans: Sequence[Any]) -> bytes:
    """`spans` (the SDK's `ReadableSpan`s) as a serialised `ExportTraceServiceRequest`, grouped by
    resource, then by instrumentation scope, in the order each first appears."""
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_field(b"\x12", _span(span)))
    out = []
    for resource, scopes in groups.values():
        body = [_field(b"\x0a", b"".join(_attributes(b"\x0a", resource.attributes)))]
        for scope, encoded in scopes.values():
            schema = scope.schema_url if scope is not None else None
            tail = _field(b"\x1a", schema.encode("utf-8")) if schema else b""
            body.append(_field(b"\x12", _field(b"\x0a", _scope(scope)) + b"".join(encoded) + tail))
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode("utf-8")))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)

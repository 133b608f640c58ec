"""JSON logs (`[logging] format = "json"`): one object per line for the service's own loggers,
uvicorn's, and the line each API request ends with (`router.telemetry.middleware`).

A line carries the record's time (UTC, ISO 8601), level, logger and message, and the structured
fields a caller passed in `extra={"fields": {...}}`; uvicorn's access lines get their client,
method, path and status as fields too. No line is built from a request's body or headers: the
per-request line names the key, never the key itself, and holds no prompt or answer text.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

REQUEST_LOGGER = "tierroute.request"
# JSON escapes the C0 controls but, with non-ASCII kept, writes these as they are: C1 controls
# (8-bit CSI to some terminals), NEL and U+2028/U+2029 (line breaks to Python's `splitlines`, to
# editors and to some log shippers). Escaped, a client's path or an upstream's words cannot split a
# line; they occur only inside a JSON string, so the line decodes to the same values.
_LINE_BREAKERS = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), 0x2028, 0x2029)}


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        elif record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, _version, status = record.args
            out |= {"client": client, "method": method, "path": path, "status": status}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False).translate(_LINE_BREAKERS)


def log_config(level: str = "info") -> dict[str, Any]:
    """A `logging.config.dictConfig` (and uvicorn `log_config`) writing every logger as JSON to stderr."""
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": lvl, "propagate": False},
            "uvicorn.error": {"level": lvl},
            "uvicorn.access": {"handlers": ["json"], "level": lvl, "propagate": False},
            REQUEST_LOGGER: {"level": "INFO"},  # the per-request line, whatever the service's level
        },
        "root": {"handlers": ["json"], "level": lvl},
    }

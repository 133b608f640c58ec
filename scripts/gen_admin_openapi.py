"""Write docs/admin-openapi.json: the admin API's OpenAPI schema, as the service generates it.

A running service serves its whole schema at `/openapi.json` (to a key of any role, where
`server.docs` is on); this file is the admin router's part, committed so that a reader of
docs/admin.md has it without a service and a key. `tests/router/api/test_admin_docs.py` fails when
the committed file is not what this script writes from today's `router/api/routes_admin.py`, or
when the served schema's admin routes differ from it:

    .venv/bin/python scripts/gen_admin_openapi.py            # rewrite docs/admin-openapi.json
    .venv/bin/python scripts/gen_admin_openapi.py --check    # exit 1 if it is stale

The schema is made from the router alone (no config, no ledger, nothing started): FastAPI builds it
from the routes' models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fastapi.openapi.utils import get_openapi

from router.api import routes_admin
from router.api.app import API_VERSION

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("docs") / "admin-openapi.json"
TITLE = "tierroute admin API"


def schema() -> dict[str, object]:
    return get_openapi(title=TITLE, version=API_VERSION, routes=routes_admin.router.routes)


def render() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file is stale")
    args = parser.parse_args(argv)
    path = ROOT / OUT
    text = render()
    if args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run .venv/bin/python scripts/gen_admin_openapi.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/opt/tierroute/bin/python3
"""The image's health check: GET /readyz on the service's own port, exit 0 when ready.

Readiness, not liveness: a replica whose tier is loading or restarting its engine answers 503 and
is reported unhealthy, which is what a load balancer needs to know. Python rather than curl: the
runtime image carries no HTTP client but the interpreter's own.
"""

import os
import sys
import urllib.error
import urllib.request

port = os.environ.get("TIERROUTE_SERVER__PORT", "8000")
# The Host allowlist covers /readyz too: a config with server.allowed_hosts names one of its hosts here.
host = os.environ.get("TIERROUTE_HEALTHCHECK_HOST", "localhost")
request = urllib.request.Request(f"http://127.0.0.1:{port}/readyz", headers={"Host": host})
try:
    with urllib.request.urlopen(request, timeout=4) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except (urllib.error.URLError, OSError) as exc:
    print(f"not ready: {exc}", file=sys.stderr)
    sys.exit(1)

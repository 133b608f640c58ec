"""Writes the replicas' seccomp profile: podman's default, plus sethostname and setdomainname.

bubblewrap gives every box its own UTS namespace and names it (``--hostname sandbox``). Podman's
default profile allows those two calls only to a container holding CAP_SYS_ADMIN, which the
replicas never get. Allowing the calls adds no power: the kernel still requires CAP_SYS_ADMIN over
the UTS namespace being renamed, which the service has only inside the namespaces bubblewrap just
made for the box, never over the container's own. Everything else is the default profile as the
host's containers-common ships it (read, not copied into this repository).

    python3 scripts/seccomp_profile.py [OUT]   (default: $TIERROUTE_BUILD_CACHE/seccomp.json)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")
CALLS = ("sethostname", "setdomainname")


def profile(default: dict[str, object]) -> dict[str, object]:
    rules = []
    for rule in default["syscalls"]:  # type: ignore[attr-defined]
        names = [n for n in rule["names"] if n not in CALLS]
        if names:
            rules.append({**rule, "names": names})
    rules.append({"names": list(CALLS), "action": "SCMP_ACT_ALLOW", "args": [], "comment": "bwrap --hostname"})
    return {**default, "syscalls": rules}


def main() -> int:
    cache = Path(os.environ.get("TIERROUTE_BUILD_CACHE", "/var/cache/tierroute-build"))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else cache / "seccomp.json"
    if not DEFAULT_PROFILE.is_file():
        print(f"{DEFAULT_PROFILE} is missing: install containers-common (comes with podman)", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile(json.loads(DEFAULT_PROFILE.read_text())), indent=1))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

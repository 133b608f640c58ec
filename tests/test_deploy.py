"""The container, compose and systemd files agree with the code and with each other.

The images themselves are built and smoke-tested by `make stack-test` (podman, minutes); these
checks are the part that can drift silently between such runs: the image's llama.cpp flags against
the Makefile's, the health check against a real HTTP server, the systemd unit's hardening against
what the sandbox needs (docs/container.md), and the compose stack's replicas against their config.
"""

from __future__ import annotations

import configparser
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from router.config import load_settings

ROOT = Path(__file__).resolve().parents[1]


def test_the_image_builds_llama_cpp_with_the_makefiles_flags() -> None:
    makefile = re.search(r"^LLAMA_CMAKE_ARGS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    containerfile = re.search(r'^ARG LLAMA_CMAKE_ARGS="(.+)"$', (ROOT / "Containerfile").read_text(), re.M)
    assert makefile and containerfile
    # the same string: `make image` passes the Makefile's, and a build without make gets the same
    assert containerfile.group(1) == makefile.group(1)
    assert "-mno-amx-tile" in makefile.group(1)


class _Readyz(http.server.BaseHTTPRequestHandler):
    status = 200
    hosts: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).hosts.append(self.headers.get("Host", ""))
        self.send_response(type(self).status if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def readyz() -> Iterator[tuple[type[_Readyz], int]]:
    handler = type("Handler", (_Readyz,), {"status": 200, "hosts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _healthcheck(port: int, **env: str) -> int:
    script = ROOT / "deploy" / "container" / "healthcheck.py"
    environ = {"PATH": os.environ.get("PATH", ""), "TIERROUTE_SERVER__PORT": str(port), **env}
    return subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, timeout=30).returncode


@pytest.mark.slow
def test_the_health_check_follows_readyz_and_names_an_allowed_host(readyz: tuple[type[_Readyz], int]) -> None:
    handler, port = readyz
    assert _healthcheck(port) == 0
    assert handler.hosts[-1] == "localhost"  # a loopback name: keyless loopback serving allows only those
    handler.status = 503
    assert _healthcheck(port, TIERROUTE_HEALTHCHECK_HOST="api.example.com") == 1
    assert handler.hosts[-1] == "api.example.com"


@pytest.mark.slow
def test_the_health_check_fails_when_nothing_listens(readyz: tuple[type[_Readyz], int]) -> None:
    _, port = readyz
    assert _healthcheck(port + 1 if port < 65535 else port - 1) == 1


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(ROOT / "deploy" / "systemd" / "tierroute.service")
    return parser


def test_the_systemd_unit_is_hardened_but_leaves_the_sandbox_its_namespaces_and_proc() -> None:
    service = _unit()["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["PrivateTmp"] == "yes"
    assert service["StateDirectory"] == "tierroute"
    assert service["WorkingDirectory"] == "/var/lib/tierroute"  # a relative ledger.path lands in the state dir
    assert service["User"] == "tierroute"
    assert service["CapabilityBoundingSet"] == ""
    # each of these covers part of /proc or forbids user namespaces: bwrap could not build its box
    for breaks_bwrap in ("ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc", "RestrictNamespaces"):
        assert breaks_bwrap not in service
    assert "SystemCallFilter" not in service
    assert "config check" in service["ExecStartPre"]  # refuses a config whose sandbox cannot start


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit_but_for_the_missing_install(tmp_path: Path) -> None:
    # the venv it starts is not installed here: only that complaint may remain
    done = subprocess.run(
        ["systemd-analyze", "verify", str(ROOT / "deploy" / "systemd" / "tierroute.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "/opt/tierroute/bin/tierroute is not executable" not in line
    ]
    assert complaints == []


def test_the_compose_replicas_share_one_config_ledger_and_the_sandbox_options() -> None:
    stack = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = stack["services"]
    replicas = [services["tierroute-a"], services["tierroute-b"]]
    ports = {r["ports"][0] for r in replicas}
    assert len(ports) == 2 and all(p.startswith("127.0.0.1:") for p in ports)
    for replica in replicas:
        assert "unmask=/proc/*" in replica["security_opt"]
        assert "no-new-privileges" in replica["security_opt"]
        assert replica["cap_drop"] == ["ALL"]
        assert not any("seccomp=unconfined" in o for o in replica["security_opt"])
        assert replica.get("user") in (None, "tierroute")  # never root with /proc unmasked
    settings = load_settings(ROOT / "deploy" / "compose" / "config.toml")
    assert settings.ledger.url is not None and "@db:" in settings.ledger.url
    assert settings.ledger.password_env == "TIERROUTE_PG_PASSWORD"
    large = [t for t in settings.tiers if t.openai is not None]
    assert large and large[0].openai is not None and large[0].openai.base_url.startswith("http://large:")


def test_the_replicas_seccomp_profile_adds_only_the_hostname_calls() -> None:
    from scripts.seccomp_profile import CALLS, profile

    default = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["read", "unshare"], "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["sethostname", "setdomainname", "mount_setattr"],
                "action": "SCMP_ACT_ALLOW",
                "includes": {"caps": ["CAP_SYS_ADMIN"]},
            },
            {
                "names": ["sethostname", "setdomainname"],
                "action": "SCMP_ACT_ERRNO",
                "excludes": {"caps": ["CAP_SYS_ADMIN"]},
            },
        ],
    }
    rules = profile(default)["syscalls"]
    assert isinstance(rules, list)
    allowed = [r for r in rules if set(CALLS) & set(r["names"])]
    assert allowed == [{"names": list(CALLS), "action": "SCMP_ACT_ALLOW", "args": [], "comment": "bwrap --hostname"}]
    # everything else as it was: the CAP_SYS_ADMIN-only rule keeps its other call, nothing else is widened
    assert rules[0] == default["syscalls"][0]  # type: ignore[index]
    assert rules[1]["names"] == ["mount_setattr"] and rules[1]["includes"] == {"caps": ["CAP_SYS_ADMIN"]}
    assert len(rules) == 3


def test_the_tracing_override_points_both_replicas_at_its_receiver() -> None:
    """deploy/compose/otlp-receiver.yaml (the stack test's traces) adds only its receiver and
    names only services compose.yaml has; both replicas export to the receiver's port."""
    stack = yaml.safe_load((ROOT / "compose.yaml").read_text())
    override = yaml.safe_load((ROOT / "deploy" / "compose" / "otlp-receiver.yaml").read_text())
    assert set(override["services"]) - set(stack["services"]) == {"otlp"}
    receiver = override["services"]["otlp"]["command"]
    assert (ROOT / receiver[1]).is_file() and receiver[-2:] == ["0.0.0.0", "4318"]
    for name in ("tierroute-a", "tierroute-b"):
        replica = override["services"][name]
        assert replica["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otlp:4318"
        assert replica["environment"]["OTEL_SERVICE_NAME"] == name
        assert replica["depends_on"] == ["otlp"]

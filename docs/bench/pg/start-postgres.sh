#!/bin/sh
# A throwaway PostgreSQL 15 for `bench overhead` with the PostgreSQL ledger: Debian's binaries, a
# temporary directory, loopback port 54329, default durability (fsync on, synchronous_commit on).
# As root, initdb and postgres run as the `postgres` user. Stop it with the command it prints.
set -eu
BIN=$(dirname "$(readlink -f "$(command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl | tail -n 1)")")
DIR=$(mktemp -d /tmp/tierroute-bench-pg.XXXXXX)
AS=""
if [ "$(id -u)" = 0 ]; then chown postgres "$DIR"; AS="runuser -u postgres --"; fi
$AS "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
$AS "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -o "-c listen_addresses=127.0.0.1 -p 54329 -k $DIR" -w start >/dev/null
$AS "$BIN/createdb" -h 127.0.0.1 -p 54329 -U postgres bench
echo "ledger: postgresql://postgres@127.0.0.1:54329/bench"
echo "stop:   $AS $BIN/pg_ctl -D $DIR/data -m fast stop && rm -rf $DIR"

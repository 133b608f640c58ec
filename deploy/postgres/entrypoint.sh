#!/bin/sh
# First start: a cluster whose only way in over TCP is a password (scram-sha-256), one role and
# one database named tierroute, owned by that role (docs/deploy.md). Later starts: just run it.
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (the tierroute role's password)}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username=postgres --auth-local=peer --auth-host=scram-sha-256 --encoding=UTF8 \
    --locale=C.UTF-8 --pwfile="$pwfile" "$PGDATA" >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
  psql -v ON_ERROR_STOP=1 -q -h /var/run/postgresql -U postgres -d postgres \
    -v pw="$POSTGRES_PASSWORD" <<'SQL'
CREATE ROLE tierroute LOGIN PASSWORD :'pw';
CREATE DATABASE tierroute OWNER tierroute;
SQL
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql \
  -c max_connections="${POSTGRES_MAX_CONNECTIONS:-100}"

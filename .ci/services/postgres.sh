# Sourced by .ci/run: install PostgreSQL (Debian) when its server binaries are missing. Nothing else: the
# session fixture in tests/scaleout/pg_server.py runs initdb + pg_ctl (as user postgres) on a free port in a
# temporary directory and stops the server at the end of the session. Without the binaries those tests skip.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; } >/dev/null \
      || echo "postgres.sh: apt-get install postgresql failed; the PostgreSQL tests will skip" >&2
  else
    echo "postgres.sh: PostgreSQL is not installed and apt-get (as root) is not available; its tests will skip" >&2
  fi
fi

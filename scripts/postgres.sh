#!/usr/bin/env bash
# A PostgreSQL cluster of your own for trying benchfarm's team setup (one store, many
# coordinators) on one machine: Debian's postgresql, listening on 127.0.0.1 only, trust
# authentication (no password: do not expose it), data in DIR.
#
#   bash scripts/postgres.sh start [DIR] [PORT]   # prints the --db URL to use
#   bash scripts/postgres.sh stop [DIR]
#
# DIR defaults to ./pg-store, PORT to 55432. A team server is set up by its administrator
# instead (createuser/createdb, password or certificate authentication); benchfarm only needs
# a database it may create tables in and the URL, e.g.
# postgresql+psycopg://USER:PASSWORD@HOST/benchfarm (psycopg, the driver, is one of benchfarm's own
# dependencies: any install of benchfarm has it).
set -euo pipefail

action=${1:-}
dir=$(realpath -m "${2:-pg-store}")
port=${3:-55432}

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
    echo "postgres.sh: Debian's postgresql is not installed (apt-get install postgresql)" >&2
    exit 1
fi
run_as=()
if [ "$(id -u)" = 0 ]; then  # initdb and postgres refuse to run as root
    run_as=(runuser -u postgres --)
fi

case "$action" in
start)
    if [ ! -d "$dir/cluster" ]; then
        mkdir -p "$dir"
        [ ${#run_as[@]} -eq 0 ] || chown postgres: "$dir"
        "${run_as[@]}" "$bin/initdb" -D "$dir/cluster" -A trust -U postgres >/dev/null
    fi
    "${run_as[@]}" "$bin/pg_ctl" -D "$dir/cluster" -l "$dir/log" -w \
        -o "-h 127.0.0.1 -p $port -k $dir" start >/dev/null
    "${run_as[@]}" "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'benchfarm'" | grep -q 1 ||
        "${run_as[@]}" "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres benchfarm
    echo "postgresql+psycopg://postgres@127.0.0.1:$port/benchfarm"
    ;;
stop)
    "${run_as[@]}" "$bin/pg_ctl" -D "$dir/cluster" -m fast stop
    ;;
*)
    echo "usage: bash scripts/postgres.sh start|stop [DIR] [PORT]" >&2
    exit 2
    ;;
esac

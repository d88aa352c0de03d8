#!/bin/sh
# usage: onhost.sh hostA|hostB COMMAND...  -- run COMMAND inside that namespace "host" under its host name
# (same as TwoHosts.command_on in /work/main/tests/multirank/netns.py)
host=$1; shift
ns=$(/work/main/.venv/bin/python -c "import json,sys; print(json.load(open('/tmp/elastic_probe/hosts/state.json'))['namespaces'][sys.argv[1]])" "$host")
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"

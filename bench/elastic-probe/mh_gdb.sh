#!/bin/bash
# usage: mh.sh NP HOSTS ARGS...  -- mpiexec run on hostA (inside its namespace) with the flags hvdliterun would
# use for --launcher-agent/--network-interface eth1 -x UCX_TLS=tcp,self, plus -disable-auto-cleanup;
# every rank wrapped by rankwrap.sh. ARGS go to python.
np=$1; hosts=$2; shift 2
cd /tmp/elastic_probe
agent=$(/work/main/.venv/bin/python -c "import json; print(json.load(open('hosts/state.json'))['agent'])")
exec ./onhost.sh hostA env PATH=/work/main/.venv/bin:/usr/sbin:/usr/bin:/bin OMP_NUM_THREADS=1 \
  UCX_TLS=tcp,self UCX_NET_DEVICES=eth1 FI_TCP_IFACE=eth1 \
  timeout 120 /work/main/.venv/bin/mpiexec -n "$np" -hosts "$hosts" -launcher ssh -launcher-exec "$agent" -iface eth1 \
  -disable-auto-cleanup /tmp/elastic_probe/rankwrap.sh /tmp/elastic_probe/gdbwrap.sh /work/main/.venv/bin/python "$@"

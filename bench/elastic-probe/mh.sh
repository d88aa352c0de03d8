#!/bin/bash
# usage: mh.sh NP HOSTS ARGS...  -- mpiexec run on hostA (inside its namespace) with the flags hvdliterun would
# use for --launcher-agent/--network-interface eth1 -x UCX_TLS=tcp,self, plus -disable-auto-cleanup;
# every rank wrapped by rankwrap.sh (MH_NOWRAP=1: ranks are direct children of the Hydra proxy).
# ARGS go to python. MH_TIMEOUT: limit for mpiexec; MH_EXTRA_ENV: more VAR=VALUE; MH_CORE=1: core dumps.
np=$1; hosts=$2; shift 2
cd /tmp/elastic_probe
[ -n "$MH_CORE" ] && ulimit -c unlimited
wrap=/tmp/elastic_probe/rankwrap.sh
[ -n "$MH_NOWRAP" ] && wrap=
agent=$(/work/main/.venv/bin/python -c "import json; print(json.load(open('hosts/state.json'))['agent'])")
exec ./onhost.sh hostA env PATH=/work/main/.venv/bin:/usr/sbin:/usr/bin:/bin OMP_NUM_THREADS=1 \
  UCX_TLS=tcp,self UCX_NET_DEVICES=eth1 FI_TCP_IFACE=eth1 ${MH_EXTRA_ENV} \
  timeout ${MH_TIMEOUT:-120} /work/main/.venv/bin/mpiexec -n "$np" -hosts "$hosts" -launcher ssh -launcher-exec "$agent" -iface eth1 \
  -disable-auto-cleanup $wrap /work/main/.venv/bin/python "$@"

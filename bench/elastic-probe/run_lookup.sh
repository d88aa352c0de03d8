#!/bin/bash
# usage: run_lookup.sh [NAMESERVER_HOST:PORT]  -- job publishes "svc1"; a separate mpiexec -n 1 looks it up.
cd /tmp/elastic_probe; export PATH=/work/main/.venv/bin:$PATH OMP_NUM_THREADS=1
ns=(); [ -n "$1" ] && ns=(-nameserver "$1")
rm -f run/port
timeout 40 mpiexec "${ns[@]}" -n 2 python accept.py --no-kill --publish svc1 & job=$!
for i in $(seq 300); do [ -f run/port ] && break; sleep 0.1; done; sleep 0.5
timeout 20 mpiexec "${ns[@]}" -n 1 python joiner.py --lookup svc1; echo "joiner rc=$?"
wait $job; echo "job rc=$?"

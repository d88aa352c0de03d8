#!/bin/bash
# usage: run_accept.sh singleton|mpiexec  -- job of 3 (rank 2 dies), then a joiner started outside it connects.
mode=$1; shift
cd /tmp/elastic_probe; export PATH=/work/main/.venv/bin:$PATH OMP_NUM_THREADS=1
rm -f run/port
timeout 60 mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python accept.py "$@" & job=$!
for i in $(seq 300); do [ -f run/port ] && break; sleep 0.1; done
if [ "$mode" = singleton ]; then timeout 60 python joiner.py; echo "joiner (plain python singleton) rc=$?"
else timeout 60 mpiexec -n 1 python joiner.py; echo "joiner (separate mpiexec -n 1) rc=$?"; fi
wait $job; echo "job mpiexec rc=$?"

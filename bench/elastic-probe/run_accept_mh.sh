#!/bin/bash
# usage: run_accept_mh.sh singleton|mpiexec -- job on hostA:2,hostB:1 (rank 2 on hostB dies); survivors accept a
# joiner started separately on hostB (inside its namespace), port name passed by file.
mode=$1
cd /tmp/elastic_probe; rm -f run/port
MH_TIMEOUT=40 ./mh.sh 3 hostA:2,hostB:1 accept.py & job=$!
for i in $(seq 300); do [ -f run/port ] && break; sleep 0.1; done
envs="PATH=/work/main/.venv/bin:/usr/sbin:/usr/bin:/bin OMP_NUM_THREADS=1 UCX_TLS=tcp,self UCX_NET_DEVICES=eth1 FI_TCP_IFACE=eth1"
if [ "$mode" = singleton ]; then
  timeout 40 ./onhost.sh hostB env -i $envs /work/main/.venv/bin/python joiner.py; echo "joiner (singleton on hostB) rc=$?"
else
  timeout 40 ./onhost.sh hostB env -i $envs /work/main/.venv/bin/mpiexec -n 1 /work/main/.venv/bin/python joiner.py; echo "joiner (mpiexec -n 1 on hostB) rc=$?"
fi
wait $job; echo "job rc=$?"

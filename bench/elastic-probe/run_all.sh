#!/bin/bash
# Re-run the main experiments; outputs go to run/all_*.txt. Needs root for the two-host part (hosts.py up first).
cd /tmp/elastic_probe; mkdir -p run
export PATH=/work/main/.venv/bin:$PATH OMP_NUM_THREADS=1
r() { local name=$1; shift; echo "\$ $*" > run/all_$name.txt; timeout 90 "$@" >> run/all_$name.txt 2>&1; echo "exit status: $?" >> run/all_$name.txt; echo "== $name: $(tail -1 run/all_$name.txt)"; }
# 1. unwrapped SIGKILL: Hydra's proxy kills the other local ranks
r 1a_unwrapped_sigkill mpiexec -disable-auto-cleanup -n 3 python shrink.py
# 1. wrapped: survivors live; detection by stall (2 s) + heartbeat, and by MPIX_Comm_get_failed
r 1b_wrapped_stall mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python shrink.py --inside --elems 1048576 --parent work --free-old
r 1c_wrapped_getfailed mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python shrink.py --inside --elems 1048576 --parent work --detect getfailed --free-old
r 1d_mpix_shrink mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python shrink.py --detect getfailed --method mpix_shrink
r 1e_unwrapped_exit3 mpiexec -disable-auto-cleanup -n 3 python elastic.py --how exit --spawn 0
# 5. ending
FINALIZE_WAIT=10 r 5a_finalize mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python shrink.py --detect getfailed --end finalize
MPI4PY_RC_FINALIZE=0 r 5b_rc_finalize_off_sysexit mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python shrink.py --detect getfailed --end sysexit
# 2. spawn (same host; host key; 2 replacements; high flag)
r 2a_spawn mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py --wrap ./rankwrap.sh
r 2b_spawn_hostkey mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py --host vm --wrap ./rankwrap.sh
r 2c_spawn2_victim1 mpiexec -disable-auto-cleanup -n 4 ./rankwrap.sh python elastic.py --victim 1 --spawn 2 --wrap ./rankwrap.sh
r 2d_parents_high mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py --wrap ./rankwrap.sh --parents-high
r 2e_second_failure_spawned mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py --wrap ./rankwrap.sh --second spawned --second-detect heartbeat
r 2f_second_failure_original mpiexec -disable-auto-cleanup -n 3 ./rankwrap.sh python elastic.py --wrap ./rankwrap.sh --second original --second-detect heartbeat
# 3. connect/accept
r 3a_accept_mpiexec ./run_accept.sh mpiexec
r 3b_accept_singleton ./run_accept.sh singleton
r 3c_lookup_no_nameserver ./run_lookup.sh
# 4. two hosts (namespaces must exist: python hosts.py up)
if [ -f hosts/state.json ]; then
  r 4a_mh_victim_hostB_spawn_hostB ./mh.sh 3 hostA:2,hostB:1 -X faulthandler elastic.py --host hostB --wrap /tmp/elastic_probe/rankwrap.sh
  r 4b_mh_victim_hostA_spawn_hostA ./mh.sh 4 hostA:2,hostB:2 -X faulthandler elastic.py --victim 1 --host hostA --wrap /tmp/elastic_probe/rankwrap.sh
  r 4c_mh_hostA_only_spawn_hostB ./mh.sh 3 hostA:3 elastic.py --host hostB --wrap /tmp/elastic_probe/rankwrap.sh
  MH_NOWRAP=1 r 4d_mh_unwrapped_victim3 ./mh.sh 4 hostA:2,hostB:2 elastic.py --victim 3 --spawn 0
  MH_EXTRA_ENV="MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp" r 4e_mh_ofi ./mh.sh 3 hostA:2,hostB:1 -X faulthandler elastic.py --host hostB --wrap /tmp/elastic_probe/rankwrap.sh --inside --elems 1048576
  r 4f_mh_accept_singleton ./run_accept_mh.sh singleton
  MH_TIMEOUT=25 r 4g_mh_spawn_unknown_host ./mh.sh 3 hostA:3 elastic.py --host hostC --wrap /tmp/elastic_probe/rankwrap.sh
fi

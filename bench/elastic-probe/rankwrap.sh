#!/bin/sh
# Run one rank under a shell that outlives it: Hydra's proxy SIGKILLs every local rank when one of its
# children dies *by a signal* (WIFSIGNALED), even with -disable-auto-cleanup. The shell turns a
# signal death into an ordinary exit status (128+sig), and ignores Hydra's SIGUSR1 failure notice.
trap '' USR1
"$@"
rc=$?
echo "rankwrap: pid $$ child exited with $rc" >&2
exit $rc

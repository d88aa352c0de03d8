#!/bin/sh
# A host discovery script for elastic jobs: prints the hosts the job may use, one "host:slots" a line.
#
#   echo localhost:3 > hosts.txt
#   hvdliterun --min-np 2 --max-np 4 --host-discovery-script ./examples/elastic/hosts.sh \
#       python examples/elastic/torch_elastic.py
#
# hvdliterun runs it every second. Edit the file while the job runs: at its next commit the job grows
# into new slots (up to --max-np) and lets go of the ranks on slots that left the list. A real cluster's
# script would ask its scheduler instead; this one prints the file named by $HOSTS_FILE (./hosts.txt).
exec cat "${HOSTS_FILE:-./hosts.txt}"

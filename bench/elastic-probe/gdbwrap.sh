#!/bin/sh
# debugging aid: run the command under gdb; print a C backtrace if it crashes
exec gdb -q -batch -ex "handle SIGUSR1 nostop noprint pass" -ex "handle SIGPIPE nostop noprint pass" -ex run -ex "bt 30" --args "$@"

"""Helpers the stages use that are not stages themselves: aligned buffers, polling waits, thread
priority, Ctrl-C deferral, ending the job on an uncaught exception, the reducescatter row split."""

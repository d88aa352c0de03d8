"""Settings: the one frozen configuration object built from ``HVDLITE_*`` (and Horovod's
``HOROVOD_*``) variables, the parsers of their values, and the Horovod names. The only package
that reads the environment."""

"""hvdliterun: builds and runs the ``mpiexec`` command that starts an hvdlite job."""

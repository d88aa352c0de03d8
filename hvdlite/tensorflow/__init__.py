"""hvdlite.tensorflow: the tensorflow adapter. Not part of this release yet; importing it says so."""

raise ImportError(
    "hvdlite.tensorflow is not implemented in this version of hvdlite yet; the core API (import hvdlite) "
    "works on NumPy arrays today"
)

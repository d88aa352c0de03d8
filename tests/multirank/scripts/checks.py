"""Assertions the per-framework API scripts share (importable: scripts run from this directory)."""


def expect_error(error, text, fn, what):
    """``fn()`` must raise ``error`` with ``text`` in its message; ``what`` names the check."""
    try:
        fn()
    except error as exc:
        assert text in str(exc), f"{what}: message {exc!s:.400} lacks {text!r}"
        return exc
    raise AssertionError(f"{what}: no {error.__name__} raised")

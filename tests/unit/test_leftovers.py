"""The launcher's clean-up of the shared-memory segments a killed job left (in a stand-in directory)."""

import mmap
import os

from hvdlite.runner.leftovers import mapped, remove_leftover_segments, segments


def _segment(directory, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as handle:
        handle.write(b"\0" * 4096)
    return path


def test_only_new_unmapped_segments_are_removed(tmp_path):
    old = _segment(tmp_path, "mpich_shm_old111")
    before = segments(str(tmp_path))
    left = _segment(tmp_path, "mpich_shm_left22")
    in_use = _segment(tmp_path, "mpich_shm_used33")
    other = _segment(tmp_path, "not_mpich_44")
    with open(in_use, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as view:
        assert "mpich_shm_used33" in mapped(str(tmp_path))
        removed = remove_leftover_segments(before, str(tmp_path), settle=0.0)
        assert view[0] == 0
    assert removed == ["mpich_shm_left22"]
    assert not os.path.exists(left)
    assert all(os.path.exists(path) for path in (old, in_use, other))


def test_nothing_to_do_without_the_directory():
    assert segments("/nonexistent/shm") == set()
    assert remove_leftover_segments(set(), "/nonexistent/shm") == []

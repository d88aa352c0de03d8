"""Every ```python block of the documentation (docs/**/*.md and README.md) runs as a whole program at np=2.

The docs' convention (tests/doc_blocks.py): a ```python block is complete and must exit 0 through the
real launcher, one compute thread per rank, within 120 s; a ```py block is a fragment and is not run.
Each block is one test, named ``page.md:LINE`` after its opening fence, and runs in its own
directory, so files it writes stay out of the repository.
"""

import pytest

from ..doc_blocks import all_python_blocks
from .harness import run_job

pytestmark = pytest.mark.multirank

BLOCKS = all_python_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_python_block_runs_at_np_2(block, tmp_path, monkeypatch):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    monkeypatch.chdir(tmp_path)  # the job starts here: what the block writes lands in tmp_path
    result = run_job(["python", str(script)], np=2, timeout=120)
    assert result.returncode == 0, (
        f"the ```python block at {block.id} exited with {result.returncode} at np=2 "
        f"(a fragment should be a ```py block)\n--- block ---\n{block.code}--- output ---\n{result.output}"
    )

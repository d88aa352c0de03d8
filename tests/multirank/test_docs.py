"""Every ```python block of the documentation (docs/**/*.md and README.md) runs as a whole program at np=2.

The docs' convention (tests/doc_blocks.py): a ```python block is complete and must exit 0 through the
real launcher, one compute thread per rank; a ```py block is a fragment and is not run. Each block is
one test, named ``page.md:LINE`` after its opening fence, and runs in its own directory, so files it
writes stay out of the repository.

The blocks that import torch share one job, the others another (together.py: one block after the
other in the same ranks, each as ``__main__`` in its own directory, hvdlite shut down between them),
so each framework starts once per rank rather than once per block. A block that fails ends its job;
its test and those of the blocks after it fail, and the first failing block's test names it.
"""

import functools
import re
from pathlib import Path

import pytest

from ..doc_blocks import CodeBlock, all_python_blocks
from .harness import shared_script

pytestmark = pytest.mark.multirank

BLOCKS = all_python_blocks()
SECONDS_PER_BLOCK = 120


def _job_of(block: CodeBlock) -> str:
    return "torch" if re.search(r"^\s*(import|from) torch", block.code, re.MULTILINE) else "other"


@functools.cache
def _block_dir(root: Path, block: CodeBlock) -> Path:
    directory = root / re.sub(r"\W", "_", block.id)
    directory.mkdir()
    (directory / "block.py").write_text(block.code)
    return directory


def _job(root: Path, name: str):
    blocks = [block for block in BLOCKS if _job_of(block) == name]
    commands = [f"--cwd={_block_dir(root, block)} {_block_dir(root, block) / 'block.py'}" for block in blocks]
    return shared_script("together.py", 2, *commands, timeout=SECONDS_PER_BLOCK * len(blocks))


@pytest.fixture(scope="session")
def blocks_root(tmp_path_factory):
    return tmp_path_factory.mktemp("doc_blocks")


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_python_block_runs_at_np_2(block, blocks_root):
    result = _job(blocks_root, _job_of(block))
    script = _block_dir(blocks_root, block) / "block.py"
    finished = [line for line in result.output.splitlines() if f"together: --cwd={script.parent} {script} took" in line]
    assert len(finished) == 2, (
        f"the ```python block at {block.id} did not finish on both ranks at np=2 (job exit code "
        f"{result.returncode}; a fragment should be a ```py block)\n--- block ---\n{block.code}--- output ---\n"
        f"{result.output}")

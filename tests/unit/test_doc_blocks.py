"""The extraction of runnable doc blocks (tests/doc_blocks.py) that tests/multirank/test_docs.py runs."""

from ..doc_blocks import ROOT, all_python_blocks, code_blocks, doc_pages, page_name, python_blocks

SAMPLE = """\
# A page

```python
import hvdlite as hvd
hvd.init()
```

```py
optimizer.step()   # a fragment: never run
```

```bash
hvdliterun -np 2 python train.py
```

!!! note
    Indented, inside an admonition:

    ```python title="train.py"
    print("indented")
    if True:
        print("nested")
    ```

````markdown
```python
print("this is text inside a markdown block, not a block")
```
````

~~~python
print("tilde")
~~~
```
"""


def test_python_blocks_are_found_with_their_fence_lines_and_fragments_are_skipped():
    blocks = python_blocks(SAMPLE, "page.md")
    assert [block.id for block in blocks] == ["page.md:3", "page.md:19", "page.md:31"]
    assert blocks[0].code == "import hvdlite as hvd\nhvd.init()\n"
    assert blocks[1].code == 'print("indented")\nif True:\n    print("nested")\n'  # dedented by the fence's indent
    assert blocks[2].code == 'print("tilde")\n'
    assert all("optimizer.step" not in block.code for block in blocks)


def test_every_fenced_block_is_seen_with_its_language():
    langs = [(block.line, block.lang) for block in code_blocks(SAMPLE)]
    assert langs == [(3, "python"), (8, "py"), (12, "bash"), (19, "python"), (25, "markdown"), (31, "python"), (34, "")]


def test_the_repositorys_python_blocks_point_at_python_fences():
    pages = doc_pages()
    assert ROOT / "README.md" in pages
    assert all(not part.startswith("_") for page in pages for part in page.parts[-2:])  # docs/_hooks is no page
    for block in all_python_blocks():
        path = ROOT / block.page if block.page == "README.md" else ROOT / "docs" / block.page
        assert page_name(path) == block.page
        fence = path.read_text(encoding="utf-8").splitlines()[block.line - 1]
        assert fence.lstrip().startswith("```python"), (block.id, fence)

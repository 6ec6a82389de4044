"""The docs say what the code does: the README's op table is generated and current."""

from __future__ import annotations

from pathlib import Path

from remote_autograd.service.ops.coverage import BEGIN, END, coverage_markdown, replace_block

ROOT = Path(__file__).resolve().parent.parent


def test_readme_op_coverage_table_is_current():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme
    assert replace_block(readme, coverage_markdown()) == readme, (
        "README's op table is stale: run `python -m remote_autograd.service.ops.coverage --write README.md`"
    )


def test_readme_quick_start_is_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    block = readme[start:readme.index("```", readme.index("```sh", start) + 5)]
    assert "make serve" in block and "make test" in block

"""Every code block in the documentation runs, so the docs cannot drift from the code.

Each page's ```bash and ```python blocks run in order, in one fresh folder per page (a page is
a tutorial: later blocks use what earlier ones wrote), as written but for the page's declared
size reductions: a page may start with

    <!-- test-replace: "total_steps=1000000" "total_steps=4096" -->

(one or more such lines; plain string replacements applied to every block of the page, so a
guide shows the budgets a real run needs and the test runs the same commands small). A block
preceded by ``<!-- not run: REASON -->`` is skipped, the reason stated (a GPU, a cluster, a
network, or a command CI runs verbatim elsewhere). A failing block fails the test with its
output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")
REPLACE = re.compile(r'^<!--\s*test-replace:\s*"(.*?)"\s*"(.*?)"\s*-->\s*$', re.M)
RUN = {"bash", "python"}


@dataclass
class Block:
    language: str
    code: str
    line: int
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """A page's fenced blocks, with the reason given in a ``not run`` comment before one."""
    text = page.read_text()
    out = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        reason = NOT_RUN.search(before[-1]) if before else None
        out.append(Block(match.group(1), match.group(2), text[:match.start()].count("\n") + 1,
                         reason.group(1) if reason else None))
    return out


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if any(b.language in RUN for b in blocks(p)))


def test_every_page_with_code_is_found_and_every_skip_says_why() -> None:
    assert {p.name for p in pages()} >= {"getting-started.md", "train.md", "offline.md"}
    for page in pages():
        for block in blocks(page):
            if block.language in RUN and block.skip is not None:
                assert len(block.skip) > 10, f"{page}:{block.line}: say why it is not run"


def test_the_extractor_reads_a_page(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text('<!-- test-replace: "a=1" "a=2" -->\n# T\n\n```bash\necho a=1\n```\n\n'
                    "<!-- not run: needs a GPU to run -->\n```python\nimport x\n```\n"
                    "```console\n$ out\n```\n")
    found = blocks(page)
    assert [(b.language, b.code, b.skip) for b in found] == [
        ("bash", "echo a=1\n", None), ("python", "import x\n", "needs a GPU to run"),
        ("console", "$ out\n", None)]
    assert REPLACE.findall(page.read_text()) == [("a=1", "a=2")]


def run_page(page: Path, folder: Path) -> None:
    replacements = REPLACE.findall(page.read_text())
    env = {**os.environ, "MINARI_DATASETS_PATH": str(folder / "datasets"),
           "OMP_WAIT_POLICY": "PASSIVE", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MUJOCO_GL", None)
    for name in ("benchmarks", "examples"):  # the guides run from a clone of the repository
        (folder / name).symlink_to(DOCS.parent / name)
    for i, block in enumerate(blocks(page)):
        if block.language not in RUN or block.skip is not None:
            continue
        code = block.code
        for old, new in replacements:
            code = code.replace(old, new)
        script = folder / f"block{i}.{'sh' if block.language == 'bash' else 'py'}"
        script.write_text(code)
        command = (["bash", "-e", "-o", "pipefail", str(script)] if block.language == "bash"
                   else [sys.executable, str(script)])
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (
            f"{page.relative_to(DOCS)}:{block.line} failed ({shlex.join(command)}):\n{code}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")


@pytest.mark.slow  # every page's commands at small sizes: ~25 min of the slow suite, 2026-11-29
@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_page_runs(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "_velocity" in page.read_text():  # a robot's page: its model from the offline root
        request.getfixturevalue("menagerie_root")
    run_page(page, tmp_path)

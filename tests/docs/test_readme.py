"""The README's Results table stays a front page: one headline a cell, the detail behind a link."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_results_cells_are_short_and_linked():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 5, "no Results table"
    for row in rows[1:]:  # the header is "| what | result |"
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 2, row
        assert all(len(c) <= 120 for c in cells), (max(len(c) for c in cells), row)
        link = re.search(r"\]\(([^)#]+)", cells[1])
        assert link, f"no link in {row!r}"
        assert (ROOT / link.group(1)).is_file(), link.group(1)

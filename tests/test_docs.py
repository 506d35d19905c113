"""The README and the docs pages as a newcomer meets them: the README stays short, every relative link of every
page leads to a file that exists (each docs page links back to the README), and every `rayeval` command the
README shows parses with rayeval's own argument parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cluster.cli.app import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_what_the_first_ten_minutes_need():
    assert len((REPO / "README.md").read_text().splitlines()) < 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.partition("#")[0]).resolve()
        assert path.exists(), f"{page.name} links to {target}, which is not there"


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent.name == "docs" and p.name != "BENCHMARKS-HISTORY.md"],
                         ids=lambda p: p.name)  # fmt: skip
def test_every_docs_page_links_back_to_the_readme(page):
    assert "](../README.md)" in page.read_text()


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("rayeval "):
                commands.append(line.strip())
    return commands


def test_the_readme_shows_commands():
    assert len(_readme_commands()) >= 4


@pytest.mark.parametrize("command", _readme_commands())
def test_every_readme_command_parses(command):
    args = shlex.split(command, comments=True)[1:]
    try:
        build_parser().parse_args(args)
    except SystemExit as exit_:
        assert exit_.code == 0, f"`{command}` does not parse"

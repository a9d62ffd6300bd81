"""The design of record and the README say what the code does: the stage table is the pipeline's
wiring, every module is named, and every command line README shows is one the parser takes."""

from __future__ import annotations

import re
import shlex

import pytest

from unibake.cli import build_parser, with_command
from unibake.pipeline import STAGES

from ..conftest import REPO

DESIGN = (REPO / "docs" / "DESIGN.md").read_text()
README = (REPO / "README.md").read_text()


def _stage_rows() -> list[list[str]]:
    table = DESIGN.split("| stage | needs | gives | what it does |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.split("|")[1:4]] for line in table.strip().splitlines()[1:]]


def _names(cell: str) -> set[str]:
    return {n.strip() for n in cell.split(",") if n.strip()}


def _needs_and_uses(cell: str) -> tuple[set[str], set[str]]:
    needs, _, uses = cell.partition("(+")
    return _names(needs), _names(uses.rstrip(")"))


def _gives(cell: str) -> set[str]:
    return {item.split(":", 1)[0].strip() for item in re.findall(r"`([^`]+)`", cell)}


def test_the_design_s_stage_table_is_the_pipeline_s_wiring():
    rows = _stage_rows()
    assert [row[0] for row in rows] == [s.name for s in STAGES], "the stage table's rows are STAGES, in order"
    for (name, needs_cell, gives_cell), stage in zip(rows, STAGES):
        needs, uses = _needs_and_uses(needs_cell)
        assert needs == set(stage.needs), f"stage {name!r}: DESIGN says it needs {sorted(needs)}"
        assert uses == set(stage.uses), f"stage {name!r}: DESIGN says it uses {sorted(uses)}"
        assert _gives(gives_cell) == set(stage.gives), f"stage {name!r}: DESIGN says it gives {gives_cell}"


def test_the_design_names_every_module_of_the_package():
    modules = DESIGN.split("## Modules", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([A-Za-z0-9_]+\.py)`", modules))
    present = {p.name for p in (REPO / "unibake").glob("*.py")}
    assert present - named == set(), "modules DESIGN.md's table does not name"
    assert named - present == set(), "modules DESIGN.md's table names that do not exist"


def _readme_command_lines() -> list[str]:
    block = README.split("## Using it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].split("|", 1)[0].strip()
            for line in block.splitlines() if line.startswith("python build.py ")]


@pytest.mark.parametrize("line", _readme_command_lines())
def test_every_command_line_the_readme_shows_is_one_the_parser_takes(line, capsys):
    # [--option VALUE] is optional: taken as given; a digest written as '...' is one
    argv = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", line).replace("sha256:...", "sha256:" + "a" * 64))[2:]
    try:
        args = build_parser().parse_args(with_command(argv))
    except SystemExit as exc:  # -V prints the version and exits 0; a refused line exits 2
        assert exc.code == 0, f"{line}: {capsys.readouterr().err}"
        return
    assert args.command is not None

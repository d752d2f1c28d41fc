"""Jupyter notebooks: discovered by default, analysed per code cell, fixed cell by cell with the
rest of the file kept byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampmigrate.notebook import Notebook, NotebookError


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cell(source, kind="code", **extra):
    base = {"cell_type": kind, "id": f"id-{len(source)}", "metadata": {"tags": ["x"]}, "source": source}
    if kind == "code":
        base.update(execution_count=7, outputs=[{"name": "stdout", "output_type": "stream", "text": ["é ok\n"]}])
    base.update(extra)
    return base


def notebook(*cells, language="python"):
    return {
        "cells": list(cells),
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": language, "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def write(path: Path, data, indent=1, ensure_ascii=False, end="\n") -> str:
    text = json.dumps(data, indent=indent, ensure_ascii=ensure_ascii) + end
    path.write_text(text, encoding="utf-8")
    return text


TRAIN = notebook(
    cell(["# Training\n", "Uses AMP."], kind="markdown"),
    cell(["%matplotlib inline\n", "!pip install -q torch\n", "import torch\n", "scaler = torch.cuda.amp.GradScaler()"]),
    cell(["%%time\n", "with torch.cuda.amp.autocast():\n", "    pass\n"]),
    cell(["for step in range(3):\n", "    with torch.cuda.amp.autocast():\n", "        y = step\n", "    files = !ls\n", "torch.save?"]),
    cell("print('untouched')\n"),
)


def test_cells_are_one_module_with_magics_as_placeholders():
    nb = Notebook(json.dumps(TRAIN))
    lines = nb.python_text.splitlines()
    assert lines[0].strip().startswith("pass") and lines[2] == "import torch"
    # A cell magic makes the whole cell opaque: its legacy autocast is not analysed.
    assert "autocast" not in "\n".join(lines[4:7])
    assert lines[10].startswith("    pass") and lines[11].startswith("pass")
    assert nb.locate(4) == (2, 4) and nb.locate(9) == (4, 2)


def test_check_locates_findings_by_cell_in_every_format(cli, project):
    write(project / "train.ipynb", TRAIN)
    concise = cli("check", "--no-cache", "--output-format", "concise")
    assert concise.exit_code == 1
    assert [line.split(" AMP")[0] for line in concise.output.splitlines()] == [
        "train.ipynb:cell 2:4:10:",
        "train.ipynb:cell 4:2:10:",
    ]
    full = cli("check", "--no-cache", "train.ipynb").output
    assert "cell 4:2:10 AMP201" in full and "  2 |     with torch.cuda.amp.autocast():" in full
    rows = json.loads(cli("check", "--no-cache", "--output-format", "json").output)
    assert [(r["cell"], r["location"]["row"], r["code"]) for r in rows] == [(2, 4, "AMP202"), (4, 2, "AMP201")]
    assert rows[1]["fix"]["edits"][0]["location"]["row"] == 2  # edits are relative to the cell too
    sarif = json.loads(cli("check", "--no-cache", "--output-format", "sarif").output)
    results = sarif["runs"][0]["results"]
    assert [r["properties"]["cell"] for r in results] == [2, 4]
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 4
    github = cli("check", "--no-cache", "--output-format", "github").output
    assert "train.ipynb:cell 4:2:10: AMP201" in github and "line=" not in github


def test_fix_changes_only_the_cells_it_fixes_and_keeps_the_rest(cli, project):
    before = write(project / "train.ipynb", TRAIN)
    result = cli("fix", "--no-cache")
    assert result.exit_code == 0, result.output
    after = (project / "train.ipynb").read_text(encoding="utf-8")
    expected = json.loads(before)
    expected["cells"][1]["source"][3] = "scaler = torch.amp.GradScaler('cuda')"  # the cells' quote style
    expected["cells"][3]["source"][1] = "    with torch.amp.autocast('cuda'):\n"
    assert after == json.dumps(expected, indent=1, ensure_ascii=False) + "\n"
    assert cli("fix", "--no-cache").output.startswith("Fixed 0 findings")
    assert (project / "train.ipynb").read_text(encoding="utf-8") == after


@pytest.mark.parametrize("layout", [dict(indent=2, ensure_ascii=True, end=""), dict(indent=4, ensure_ascii=False, end="\n")])
def test_fix_keeps_the_json_layout(cli, project, layout):
    data = notebook(cell("import torch\nscaler = torch.cuda.amp.GradScaler()\n"))
    write(project / "nb.ipynb", data, **layout)
    assert cli("fix", "--no-cache").exit_code == 0
    data["cells"][0]["source"] = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
    expected = json.dumps(data, indent=layout["indent"], ensure_ascii=layout["ensure_ascii"]) + layout["end"]
    assert (project / "nb.ipynb").read_text(encoding="utf-8") == expected


def test_a_layout_it_cannot_reproduce_is_left_alone_with_an_error(cli, project):
    text = json.dumps(notebook(cell("import torch\nscaler = torch.cuda.amp.GradScaler()\n")), indent=1).replace('"cells": [', '"cells":  [')
    (project / "odd.ipynb").write_text(text, encoding="utf-8")
    result = cli("fix", "--no-cache")
    assert result.exit_code == 2
    assert "odd.ipynb: cannot fix: the notebook's JSON layout cannot be reproduced" in result.stderr
    assert (project / "odd.ipynb").read_text(encoding="utf-8") == text


def test_untouched_notebooks_are_not_rewritten(cli, project):
    text = write(project / "clean.ipynb", notebook(cell("import torch\nwith torch.amp.autocast('cuda'):\n    pass\n")))
    assert cli("fix", "--no-cache").output.startswith("Fixed 0 findings")
    assert (project / "clean.ipynb").read_text(encoding="utf-8") == text


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"cells": [', "invalid notebook: not valid JSON"),
        ('{"worksheets": [], "nbformat": 3}', "nbformat 3 is not supported"),
        ('{"cells": [{"source": "x"}], "nbformat": 4}', "cell 1 has no `cell_type`"),
        ("[]", "the top level is not a JSON object"),
    ],
)
def test_an_invalid_notebook_is_one_clear_error(cli, project, text, message):
    (project / "bad.ipynb").write_text(text, encoding="utf-8")
    (project / "ok.py").write_text("import torch\nwith torch.cuda.amp.autocast():\n    pass\n", encoding="utf-8")
    result = cli("check", "--no-cache", "--output-format", "concise")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: bad.ipynb: invalid notebook: ") and message in errors[0]
    assert "ok.py:2:6: AMP201" in result.output  # the run goes on


def test_a_cell_that_is_not_python_is_skipped_and_the_rest_analysed(cli, project):
    broken = cell("x = torch.cuda.amp.autocast(\n")  # Jupyter would refuse it too
    write(project / "nb.ipynb", notebook(cell("import torch\n"), broken, cell("s = torch.cuda.amp.GradScaler()\n")))
    result = cli("check", "--no-cache", "--output-format", "concise")
    assert result.exit_code == 1 and result.output.startswith("nb.ipynb:cell 3:1:5: AMP202")
    assert cli("fix", "--no-cache").exit_code == 0
    assert json.loads((project / "nb.ipynb").read_text())["cells"][1]["source"] == "x = torch.cuda.amp.autocast(\n"


def test_uppercase_unicode_escapes_are_kept(cli, project):
    data = notebook(cell("import torch\nscaler = torch.cuda.amp.GradScaler()\n", outputs=[{"text": "\x1b[33mwarn\x1b[0m"}]))
    text = json.dumps(data, indent=1, ensure_ascii=True).replace("\\u001b", "\\u001B") + "\n"
    (project / "nb.ipynb").write_text(text, encoding="utf-8")
    assert cli("fix", "--no-cache").exit_code == 0
    after = (project / "nb.ipynb").read_text(encoding="utf-8")
    assert after == text.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler(\\"cuda\\")')


def test_noqa_in_a_cell_and_non_python_kernels(cli, project):
    write(project / "a.ipynb", notebook(cell("import torch\nwith torch.cuda.amp.autocast():  # noqa: AMP201\n    pass\n")))
    write(project / "r.ipynb", notebook(cell("import torch\nwith torch.cuda.amp.autocast():\n    pass\n"), language="R"))
    assert cli("check", "--no-cache", "--output-format", "concise").output == ""


def test_a_code_cell_source_string_stays_a_string(cli, project):
    data = notebook(cell("import torch\nscaler = torch.cuda.amp.GradScaler()"))
    write(project / "s.ipynb", data)
    cli("fix", "--no-cache")
    fixed = json.loads((project / "s.ipynb").read_text(encoding="utf-8"))
    assert fixed["cells"][0]["source"] == 'import torch\nscaler = torch.amp.GradScaler("cuda")'


def test_a_fix_that_would_drop_a_magic_is_refused():
    nb = Notebook(json.dumps(notebook(cell("!nvidia-smi\nimport torch\n"))))
    with pytest.raises(NotebookError, match="removed an IPython magic"):
        nb.with_python_text("import torch\n")

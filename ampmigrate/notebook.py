"""Jupyter notebooks: their code cells as one Python text, and fixed text back into the notebook.

Like ruff, the code cells are joined into one module (names imported in cell 1 resolve in
cell 3), and findings are located by cell: `train.ipynb:cell 3:2:5` (cells are numbered as the
notebook shows them, markdown cells included). IPython syntax is not Python: a cell magic
(`%%time`) makes the whole cell opaque, and a line magic or shell escape (`%matplotlib inline`,
`!pip install x`, `files = !ls`, `obj?`) becomes a placeholder `pass` statement of the same
indentation, so rows stay where they were; the original line comes back when the cell is written.

A fix writes only the cells whose code changed: everything else (outputs, execution counts,
metadata, cell ids, key order) is the notebook's own, and the file is serialised again only when
its layout (indentation, escaping, trailing newline) can be reproduced byte for byte; otherwise
the notebook is left unchanged with an error. nbformat is not needed: validation here checks the
structure the analysis relies on (nbformat 4: a `cells` list of cells with a `cell_type` and a
`source`).
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Tuple

NOTEBOOK_SUFFIX = ".ipynb"
_PLACEHOLDER = "pass  # __ampmigrate_magic_{}__"
_PLACEHOLDER_LINE = re.compile(r"^[ \t]*pass  # __ampmigrate_magic_(\d+)__$")
# `%magic`, `!cmd`, `?obj` / `obj?` (help), `name = !cmd` / `name = %magic`.
_MAGIC = re.compile(r"^\s*(?:[%!?]|[\w.\[\]'\", ]+\s*=\s*[%!])|^[^#'\"]*[\w)\]]\?\??\s*$")


# A `\uXXXX` escape (after an even number of backslashes, so not an escaped backslash).
_UNICODE_ESCAPE = re.compile(r"((?<!\\)(?:\\\\)*\\u)([0-9a-fA-F]{4})")


class NotebookError(Exception):
    """A notebook that cannot be read or written back; one line, naming no path."""


def is_notebook(path: str) -> bool:
    return path.endswith(NOTEBOOK_SUFFIX)


@dataclass
class _Cell:
    index: int  # 1-based, among all cells
    lines: List[str]  # the code cell's lines, each ending with "\n"
    ends_with_newline: bool
    as_list: bool  # the source was stored as a list of lines


class Notebook:
    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self.data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotebookError(f"invalid notebook: not valid JSON: {exc}") from None
        self.cells = self._code_cells()
        self.magics: Dict[int, str] = {}  # placeholder number -> original line
        python_lines: List[str] = []
        self.owner: List[Tuple[int, int]] = []  # per Python row (0-based): (cell index, row in cell)
        for cell in self.cells:
            for row, line in enumerate(self._python_lines_of(cell), start=1):
                python_lines.append(line)
                self.owner.append((cell.index, row))
        self.python_text = "".join(python_lines)
        self._python_lines = python_lines

    def _python_lines_of(self, cell: _Cell) -> List[str]:
        """The cell's lines with IPython syntax as placeholders. A cell that is not Python even
        then (a cell magic, or code that does not parse, which Jupyter would refuse as well) is
        all placeholders: it is skipped, and the other cells are still analysed."""
        if _parses("".join(cell.lines)):
            return list(cell.lines)
        opaque = bool(cell.lines) and cell.lines[0].lstrip().startswith("%%")
        first = len(self.magics)
        lines = self._with_placeholders(cell.lines, opaque)
        if not opaque and not _parses("".join(lines)):
            for number in range(first, len(self.magics)):
                del self.magics[number]
            lines = self._with_placeholders(cell.lines, True)
        return lines

    def _with_placeholders(self, lines: List[str], whole: bool) -> List[str]:
        result = []
        continuation = False
        for line in lines:
            if whole or continuation or _MAGIC.match(line.rstrip("\n")):
                continuation = line.rstrip("\n").endswith("\\")
                number = len(self.magics)
                self.magics[number] = line
                indent = "" if whole else line[: len(line) - len(line.lstrip())]
                line = indent + _PLACEHOLDER.format(number) + "\n"
            result.append(line)
        return result

    @property
    def is_python(self) -> bool:
        metadata = self.data.get("metadata") or {}
        language = (metadata.get("language_info") or {}).get("name") or (metadata.get("kernelspec") or {}).get("language")
        return language in (None, "python") or str(language).lower().startswith("python")

    def _code_cells(self) -> List[_Cell]:
        data = self.data
        if not isinstance(data, dict):
            raise NotebookError("invalid notebook: the top level is not a JSON object")
        if "worksheets" in data:
            raise NotebookError("invalid notebook: nbformat 3 is not supported (convert it with `jupyter nbconvert --to notebook`)")
        cells = data.get("cells")
        if not isinstance(cells, list) or not isinstance(data.get("nbformat"), int):
            raise NotebookError("invalid notebook: not nbformat 4 (no `cells` list or `nbformat` number)")
        found = []
        for index, cell in enumerate(cells, start=1):
            if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
                raise NotebookError(f"invalid notebook: cell {index} has no `cell_type`")
            source = cell.get("source")
            if isinstance(source, list) and all(isinstance(part, str) for part in source):
                text, as_list = "".join(source), True
            elif isinstance(source, str):
                text, as_list = source, False
            else:
                raise NotebookError(f"invalid notebook: cell {index} has no `source` text")
            if cell["cell_type"] != "code":
                continue
            lines = text.splitlines(keepends=True)
            ends = text.endswith("\n")
            if lines and not ends:
                lines[-1] += "\n"
            found.append(_Cell(index, lines, ends, as_list))
        return found

    # ------------------------------------------------------------------ positions
    def locate(self, row: int) -> Tuple[int, int]:
        """(cell, row in the cell) of a 1-based row of `python_text`."""
        if not self.owner:
            return 1, row
        return self.owner[min(max(row, 1), len(self.owner)) - 1]

    # ------------------------------------------------------------------ writing back
    def with_python_text(self, new_text: str) -> str:
        """The notebook's text with `new_text` (the fixed `python_text`) put back into its cells."""
        new_lines = new_text.splitlines(keepends=True)
        if new_lines and not new_lines[-1].endswith("\n"):
            new_lines[-1] += "\n"
        owners = [cell for cell, _ in self.owner]
        by_cell: Dict[int, List[str]] = {cell.index: [] for cell in self.cells}
        matcher = difflib.SequenceMatcher(None, self._python_lines, new_lines, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for offset in range(i2 - i1):
                    by_cell[owners[i1 + offset]].append(new_lines[j1 + offset])
                continue
            cells = set(owners[i1:i2])
            if not cells:  # an insertion: it belongs with the line it comes before
                cells = {owners[i1] if i1 < len(owners) else owners[-1]} if owners else set()
            if len(cells) != 1:
                raise NotebookError("cannot fix: a change spans several cells; notebook left unchanged")
            by_cell[cells.pop()].extend(new_lines[j1:j2])
        seen = set()
        changed: Dict[int, str] = {}
        for cell in self.cells:
            lines = []
            for line in by_cell[cell.index]:
                match = _PLACEHOLDER_LINE.match(line.rstrip("\n"))
                if match:
                    number = int(match.group(1))
                    if number in seen or number not in self.magics:
                        raise NotebookError("cannot fix: an IPython magic moved; notebook left unchanged")
                    seen.add(number)
                    line = self.magics[number]
                lines.append(line)
            source = "".join(lines)
            if not cell.ends_with_newline and source.endswith("\n"):
                source = source[:-1]
            old = "".join(cell.lines)
            if not cell.ends_with_newline and old.endswith("\n"):
                old = old[:-1]
            if source != old:
                changed[cell.index] = source
        if seen != set(self.magics):
            raise NotebookError("cannot fix: a fix removed an IPython magic; notebook left unchanged")
        if not changed:
            return self.text
        dump = self._serializer()
        data = json.loads(self.text)
        for cell in self.cells:
            if cell.index in changed:
                source = changed[cell.index]
                data["cells"][cell.index - 1]["source"] = source.splitlines(keepends=True) if cell.as_list else source
        return dump(data)

    def _serializer(self):
        """A function that writes this notebook's JSON exactly as the file has it, or NotebookError."""
        original = json.loads(self.text)
        layouts = [(indent, None) for indent in (1, 2, 4, 3, "\t", None)] + [(None, (",", ":"))]
        # Some writers spell escapes in upper case (`\u001B`); json.dumps writes `\u001b`.
        upper = re.search(r"\\u[0-9a-f]{0,3}[A-F]", self.text) is not None
        for indent, separators in layouts:
            for ensure_ascii in (False, True):
                for end in ("\n", "", "\r\n"):

                    def dump(data, indent=indent, separators=separators, ensure_ascii=ensure_ascii, end=end) -> str:
                        text = json.dumps(data, indent=indent, separators=separators, ensure_ascii=ensure_ascii)
                        if upper:
                            text = _UNICODE_ESCAPE.sub(lambda m: m.group(1) + m.group(2).upper(), text)
                        return (text.replace("\n", "\r\n") if end == "\r\n" else text) + end

                    if dump(original) == self.text:
                        return dump
        raise NotebookError(
            "cannot fix: the notebook's JSON layout cannot be reproduced byte for byte; notebook left unchanged"
        )


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True

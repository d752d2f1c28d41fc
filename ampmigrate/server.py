"""`ampmigrate server`: a language server over stdio (pygls; `pip install 'ampmigrate[server]'`).

Diagnostics are published when a document is opened, changed or saved; every finding with a fix
offers it as a quick fix (unsafe ones say so and are never preferred), and the source action
"fix all" (`source.fixAll.ampmigrate`) applies the safe fixes (the unsafe ones too where the
configuration sets `unsafe-fixes`), exactly as `ampmigrate fix` would. Settings come from the
configuration the CLI would read for the document's directory. Python files and notebooks work:
a notebook document's code cells are analysed together, like `check` does for an `.ipynb` file,
and each cell gets its own diagnostics.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from ampmigrate import __version__
from ampmigrate.config import ConfigError, Settings, resolve_settings
from ampmigrate.diagnostics import Finding
from ampmigrate.engine.notebooks import process_notebook
from ampmigrate.engine.pipeline import Engine
from ampmigrate.notebook import is_notebook
from ampmigrate.source import split_lines

SOURCE = "ampmigrate"
FIX_ALL = types.CodeActionKind.SourceFixAll + ".ampmigrate"
_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "info": types.DiagnosticSeverity.Information,
}

server = LanguageServer("ampmigrate", __version__, notebook_document_sync=types.NotebookDocumentSyncOptions(
    notebook_selector=[types.NotebookDocumentFilterWithCells(
        notebook="jupyter-notebook", cells=[types.NotebookCellLanguage(language="python")]
    )],
    save=True,
))


# ---------------------------------------------------------------------------------- analysis
def _settings(path: str) -> Settings:
    return resolve_settings(start=os.path.dirname(os.path.abspath(path)))


def _path(uri: str) -> str:
    return to_fs_path(uri) or uri


def _check(ls: LanguageServer, uri: str, text: str) -> List[Finding]:
    """The findings of a text document (with their fixes' edits), or none after a config error."""
    path = _path(uri)
    if is_notebook(path):
        return []  # an .ipynb opened as JSON text: its notebook document view gets the diagnostics
    try:
        settings = _settings(path)
    except ConfigError as exc:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=f"ampmigrate: {exc}"))
        return []
    engine = Engine(settings)
    result = engine.check_text(text, path, want_edits=True)
    return result.findings


def _range(lines: List[str], start, end) -> types.Range:
    """1-based (row, character column) pairs to an LSP range in UTF-16 units."""
    return types.Range(_position(lines, start.row, start.column), _position(lines, end.row, end.column))


def _position(lines: List[str], row: int, column: int) -> types.Position:
    line = lines[row - 1] if 0 < row <= len(lines) else ""
    return types.Position(row - 1, len(line[: column - 1].encode("utf-16-le")) // 2)


def _diagnostic(finding: Finding, lines: List[str]) -> types.Diagnostic:
    data = None
    if finding.fix is not None:
        data = {"fix": finding.fix.message, "applicability": finding.fix.applicability}
    message = finding.message if finding.fix is not None or not finding.no_fix_reason else f"{finding.message} (no fix: {finding.no_fix_reason})"
    return types.Diagnostic(
        range=_range(lines, finding.location, finding.end_location),
        message=message,
        severity=_SEVERITY.get(finding.severity, types.DiagnosticSeverity.Warning),
        code=finding.code,
        source=SOURCE,
        data=data,
    )


def _lines(text: str) -> List[str]:
    return split_lines(text)


def publish(ls: LanguageServer, uri: str) -> None:
    document = ls.workspace.get_text_document(uri)
    findings = _check(ls, uri, document.source)
    lines = _lines(document.source)
    ls.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(uri=uri, diagnostics=[_diagnostic(f, lines) for f in findings], version=document.version)
    )


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def document_updated(ls: LanguageServer, params) -> None:
    """Opened, changed or saved: publish the document's diagnostics again."""
    if not _is_cell(params.text_document.uri):
        publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    if not _is_cell(params.text_document.uri):
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


# ---------------------------------------------------------------------------------- code actions
@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL], resolve_provider=False),
)
def code_action(ls: LanguageServer, params: types.CodeActionParams) -> List[types.CodeAction]:
    uri = params.text_document.uri
    if _is_cell(uri):
        return _notebook_actions(ls, uri, params)
    document = ls.workspace.get_text_document(uri)
    text = document.source
    lines = _lines(text)
    wanted = params.context.only
    actions: List[types.CodeAction] = []
    if not wanted or any(types.CodeActionKind.QuickFix.startswith(k) or k.startswith(types.CodeActionKind.QuickFix) for k in wanted):
        for finding in _check(ls, uri, text):
            diagnostic = _diagnostic(finding, lines)
            if finding.fix is None or not finding.fix.edits or not _overlaps(diagnostic.range, params.range):
                continue
            edits = [types.TextEdit(_range(lines, e.location, e.end_location), e.content) for e in finding.fix.edits]
            actions.append(_quick_fix(finding, diagnostic, {uri: edits}))
    if not wanted or any(FIX_ALL.startswith(k) for k in wanted):
        action = _fix_all(ls, uri, text, lines)
        if action is not None:
            actions.append(action)
    return actions


def _quick_fix(finding: Finding, diagnostic: types.Diagnostic, changes: Dict[str, List[types.TextEdit]]) -> types.CodeAction:
    unsafe = finding.fix.applicability != "safe"
    title = f"{finding.code}: {finding.fix.message}" + (" (unsafe: changes numerics or behaviour)" if unsafe else "")
    return types.CodeAction(
        title=title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=types.WorkspaceEdit(changes=changes),
        is_preferred=not unsafe,
    )


def _fix_all(ls: LanguageServer, uri: str, text: str, lines: List[str]) -> Optional[types.CodeAction]:
    path = _path(uri)
    try:
        settings = _settings(path)
    except ConfigError:
        return None
    result = Engine(settings).fix_text(text, path)
    if result.new_text is None:
        return None
    end = types.Position(len(lines), 0) if text.endswith(("\n", "\r")) or not lines else _position(lines, len(lines), len(lines[-1]) + 1)
    edit = types.TextEdit(types.Range(types.Position(0, 0), end), result.new_text)
    title = "ampmigrate: fix all" + (" (including unsafe fixes)" if settings.unsafe_fixes else " (safe fixes)")
    return types.CodeAction(title=title, kind=FIX_ALL, edit=types.WorkspaceEdit(changes={uri: [edit]}))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> Tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


# ---------------------------------------------------------------------------------- notebooks
def _is_cell(uri: str) -> bool:
    """Whether `uri` is a cell of an open notebook document (handled with its notebook)."""
    return server.workspace.get_notebook_document(cell_uri=uri) is not None


def _notebook_cells(ls: LanguageServer, notebook_uri: str) -> Tuple[Optional[object], List[str]]:
    notebook = ls.workspace.get_notebook_document(notebook_uri=notebook_uri)
    if notebook is None:
        return None, []
    return notebook, [cell.document for cell in notebook.cells if cell.kind == types.NotebookCellKind.Code]


def _notebook_findings(ls: LanguageServer, notebook_uri: str):
    """(cell uris in order, {cell number: findings}) of a notebook document's code cells."""
    notebook, cell_uris = _notebook_cells(ls, notebook_uri)
    if notebook is None:
        return [], {}
    cells = [{"cell_type": "code", "metadata": {}, "source": ls.workspace.get_text_document(u).source} for u in cell_uris]
    text = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    path = _path(notebook_uri)
    try:
        settings = _settings(path)
    except ConfigError as exc:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=f"ampmigrate: {exc}"))
        return cell_uris, {}
    result = process_notebook(Engine(settings), text, path, "check", want_edits=True)
    by_cell: Dict[int, List[Finding]] = {}
    for finding in result.findings:
        by_cell.setdefault(finding.cell or 1, []).append(finding)
    return cell_uris, by_cell


def publish_notebook(ls: LanguageServer, notebook_uri: str) -> None:
    cell_uris, by_cell = _notebook_findings(ls, notebook_uri)
    for number, cell_uri in enumerate(cell_uris, start=1):
        lines = _lines(ls.workspace.get_text_document(cell_uri).source)
        diagnostics = [_diagnostic(f, lines) for f in by_cell.get(number, [])]
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=diagnostics))


def _notebook_actions(ls: LanguageServer, cell_uri: str, params: types.CodeActionParams) -> List[types.CodeAction]:
    notebook = ls.workspace.get_notebook_document(cell_uri=cell_uri)
    if notebook is None:
        return []
    cell_uris, by_cell = _notebook_findings(ls, notebook.uri)
    if cell_uri not in cell_uris:
        return []
    lines = _lines(ls.workspace.get_text_document(cell_uri).source)
    actions = []
    for finding in by_cell.get(cell_uris.index(cell_uri) + 1, []):
        diagnostic = _diagnostic(finding, lines)
        if finding.fix is None or not finding.fix.edits or not _overlaps(diagnostic.range, params.range):
            continue
        edits = [types.TextEdit(_range(lines, e.location, e.end_location), e.content) for e in finding.fix.edits]
        actions.append(_quick_fix(finding, diagnostic, {cell_uri: edits}))
    return actions


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
def notebook_updated(ls: LanguageServer, params) -> None:
    publish_notebook(ls, params.notebook_document.uri)


def serve() -> None:
    server.start_io()

"""`ampmigrate server` end to end with a real LSP client (pytest-lsp): open a legacy document,
receive diagnostics, apply a quick fix and "fix all", see the result; notebooks; configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts the server in a subprocess

pytest.importorskip("pygls")
pytest_lsp = pytest.importorskip("pytest_lsp")
from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LEGACY = "import torch\n\nwith torch.cuda.amp.autocast():\n    s = torch.cuda.amp.GradScaler()\n"


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "ampmigrate", "server"], server_env={"PYTHONPATH": str(ROOT)}))
async def client(lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("workspace")
    params = types.InitializeParams(
        capabilities=types.ClientCapabilities(
            notebook_document=types.NotebookDocumentClientCapabilities(
                synchronization=types.NotebookDocumentSyncClientCapabilities()
            )
        ),
        root_uri=root.as_uri(),
    )
    await lsp_client.initialize_session(params)
    lsp_client.root = root
    yield
    await lsp_client.shutdown_session()


def apply(text: str, edits) -> str:
    """Apply LSP text edits (ASCII text, so UTF-16 columns are character columns)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def offset(position):
        return offsets[position.line] + position.character if position.line < len(lines) else len(text)

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


async def published(client: LanguageClient, *uris: str, timeout: float = 60.0):
    """Wait until diagnostics for every one of `uris` have arrived since they were last taken
    (pops them, so the next call waits for fresh ones). Polling, not `wait_for_notification`:
    two notifications can arrive before a second wait is registered."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not all(uri in client.diagnostics for uri in uris):
        assert loop.time() < deadline, f"no diagnostics for {uris} within {timeout}s"
        await asyncio.sleep(0.05)
    return [list(client.diagnostics.pop(uri)) for uri in uris]


def open_document(client, path: Path, text: str, version: int = 1) -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text))
    )
    return uri


@pytest.mark.asyncio
async def test_diagnostics_quick_fix_and_fix_all(client: LanguageClient):
    uri = open_document(client, client.root / "train.py", LEGACY)
    (diagnostics,) = await published(client, uri)
    assert [(d.code, d.range.start.line, d.range.start.character) for d in diagnostics] == [("AMP201", 2, 5), ("AMP202", 3, 8)]
    assert all(d.source == "ampmigrate" for d in diagnostics)

    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostics[0].range,
            context=types.CodeActionContext(diagnostics=[diagnostics[0]]),
        )
    )
    quick = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert [a.title.split(":")[0] for a in quick] == ["AMP201"] and quick[0].is_preferred
    fixed_once = apply(LEGACY, quick[0].edit.changes[uri])
    assert fixed_once == LEGACY.replace("torch.cuda.amp.autocast()", 'torch.amp.autocast("cuda")')

    fix_all = [a for a in actions if a.kind == "source.fixAll.ampmigrate"]
    assert len(fix_all) == 1
    assert apply(LEGACY, fix_all[0].edit.changes[uri]) == (
        'import torch\n\nwith torch.amp.autocast("cuda"):\n    s = torch.amp.GradScaler("cuda")\n'
    )

    # After the edit the client sends a change: the diagnostics follow.
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed_once)],
        )
    )
    (after_change,) = await published(client, uri)
    assert [d.code for d in after_change] == ["AMP202"]

    # Saving publishes again (after a configuration change, say).
    (client.root / "ampmigrate.toml").write_text('ignore = ["AMP202"]\n')
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert await published(client, uri) == [[]]


@pytest.mark.asyncio
async def test_unsafe_fixes_are_marked_and_the_configuration_is_read(client: LanguageClient):
    (client.root / "ampmigrate.toml").write_text('select = ["AMP401"]\n')
    text = (ROOT / "tests" / "fixtures" / "AMP401" / "explicit_dtype.py").read_text()
    uri = open_document(client, client.root / "p.py", text)
    (diagnostics,) = await published(client, uri)
    assert {d.code for d in diagnostics} == {"AMP401"}  # the configuration's selection
    diagnostic = diagnostics[0]
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    (quick,) = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert "unsafe" in quick.title and not quick.is_preferred
    assert not [a for a in actions if a.kind == "source.fixAll.ampmigrate"]  # safe fixes only: nothing to do


@pytest.mark.asyncio
async def test_notebook_cells_get_their_own_diagnostics(client: LanguageClient):
    nb_uri = (client.root / "train.ipynb").as_uri()
    cells = ["import torch\n!nvidia-smi\n", "# notes\nwith torch.cuda.amp.autocast():\n    pass\n"]
    cell_uris = [f"vscode-notebook-cell:{client.root / 'train.ipynb'}#cell{i}" for i in range(len(cells))]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=nb_uri,
                notebook_type="jupyter-notebook",
                version=1,
                cells=[types.NotebookCell(kind=types.NotebookCellKind.Code, document=u) for u in cell_uris],
            ),
            cell_text_documents=[
                types.TextDocumentItem(uri=u, language_id="python", version=1, text=t) for u, t in zip(cell_uris, cells)
            ],
        )
    )
    first, second = await published(client, *cell_uris)
    assert first == []
    (diagnostic,) = second
    assert diagnostic.code == "AMP201" and diagnostic.range.start.line == 1
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=cell_uris[1]),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    (quick,) = actions
    assert apply(cells[1], quick.edit.changes[cell_uris[1]]) == '# notes\nwith torch.amp.autocast("cuda"):\n    pass\n'

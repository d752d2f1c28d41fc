"""SARIF 2.1.0, for GitHub code scanning: one run, the tool's rules, results with fixes.

Locations are URIs relative to the directory the command ran in (`%SRCROOT%`, declared in
`originalUriBaseIds`), which is what code scanning expects when ampmigrate runs from the
repository root; files outside it get absolute `file://` URIs. In a notebook, a result's region
is relative to its cell, given as the result's `properties.cell` and in its message. Columns count characters
(`columnKind: unicodeCodePoints`), 1-based, with `endColumn` just past the region.
"""

import json
import os
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from ampmigrate import __version__
from ampmigrate.catalogue import load_catalogue
from ampmigrate.output import Report

_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"


def artifact_location(path: str) -> dict:
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(Path.cwd())
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(relative.as_posix()), "uriBaseId": SRCROOT}


def _region(start, end) -> dict:
    return {
        "startLine": start.row,
        "startColumn": start.column,
        "endLine": end.row,
        "endColumn": end.column,
    }


def _rule(doc) -> dict:
    why = doc.why.strip()
    return {
        "id": doc.code,
        "name": doc.name,
        "shortDescription": {"text": doc.summary},
        "fullDescription": {"text": why},
        "help": {
            "text": f"{doc.summary}\n\n{why}\n\nFix: {doc.fix}. More: {doc.url}",
            "markdown": f"{doc.summary}\n\n{why}\n\n**Fix:** {doc.fix}. [Rule documentation]({doc.url})",
        },
        "helpUri": doc.url,
        "defaultConfiguration": {"level": _LEVEL[doc.severity]},
        "properties": {"fix": doc.fix, "family": doc.family, "tags": ["pytorch", "mixed-precision", doc.family]},
    }


def _fixes(finding, location: dict) -> Optional[list]:
    if finding.fix is None or not finding.fix.edits:
        return None
    return [
        {
            "description": {"text": f"{finding.fix.message} ({finding.fix.applicability} fix)"},
            "artifactChanges": [
                {
                    "artifactLocation": location,
                    "replacements": [
                        {
                            "deletedRegion": _region(edit.location, edit.end_location),
                            "insertedContent": {"text": edit.content},
                        }
                        for edit in finding.fix.edits
                    ],
                }
            ],
        }
    ]


def render(report: Report) -> str:
    docs = load_catalogue()
    codes = sorted(docs)
    index = {code: i for i, code in enumerate(codes)}
    results = []
    for f in report.findings:
        location = artifact_location(f.path)
        result = {"ruleId": f.code}
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        result.update(
            {
                "level": _LEVEL.get(f.severity, "warning"),
                "message": {"text": f.message if f.cell is None else f"cell {f.cell}: {f.message}"},
                "locations": [
                    {"physicalLocation": {"artifactLocation": location, "region": _region(f.location, f.end_location)}}
                ],
            }
        )
        fixes = _fixes(f, location)
        if fixes:
            result["fixes"] = fixes
        properties = {}
        if f.fix is None and f.no_fix_reason:
            properties["noFixReason"] = f.no_fix_reason
        if f.cell is not None:
            properties["cell"] = f.cell  # a notebook: the region's lines are the cell's
        if properties:
            result["properties"] = properties
        results.append(result)
    notifications = [
        {
            "level": "error",
            "message": {"text": str(error)},
            "locations": [{"physicalLocation": {"artifactLocation": artifact_location(error.path)}}],
        }
        for error in report.errors
    ]
    invocation = {"executionSuccessful": not report.errors}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    run = {
        "tool": {
            "driver": {
                "name": "ampmigrate",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": "https://github.com/ampmigrate/ampmigrate",
                "rules": [_rule(docs[code]) for code in codes],
            }
        },
        "originalUriBaseIds": {SRCROOT: {"uri": Path.cwd().as_uri() + "/"}},
        "invocations": [invocation],
        "columnKind": "unicodeCodePoints",
        "results": results,
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"

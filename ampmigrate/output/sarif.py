"""SARIF 2.1.0, for GitHub code scanning: one run, the tool's rules, results with fixes."""

import json
import os
from pathlib import Path

from ampmigrate import __version__
from ampmigrate.catalogue import load_catalogue
from ampmigrate.output import Report

_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _uri(path: str) -> str:
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_uri()


def _region(start, end) -> dict:
    return {
        "startLine": start.row,
        "startColumn": start.column,
        "endLine": end.row,
        "endColumn": end.column,
    }


def render(report: Report) -> str:
    docs = load_catalogue()
    codes = sorted(docs)
    index = {code: i for i, code in enumerate(codes)}
    rules = [
        {
            "id": code,
            "name": docs[code].name,
            "shortDescription": {"text": docs[code].summary},
            "fullDescription": {"text": docs[code].why.strip()},
            "help": {"text": f"{docs[code].summary}\n\n{docs[code].why.strip()}"},
            "helpUri": docs[code].url,
            "defaultConfiguration": {"level": _LEVEL[docs[code].severity]},
            "properties": {"fix": docs[code].fix, "family": docs[code].family},
        }
        for code in codes
    ]
    results = []
    for f in report.findings:
        uri = _uri(f.path)
        result = {
            "ruleId": f.code,
            "ruleIndex": index.get(f.code, 0),
            "level": _LEVEL.get(f.severity, "warning"),
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri},
                        "region": _region(f.location, f.end_location),
                    }
                }
            ],
        }
        if f.fix is not None and f.fix.edits:
            result["fixes"] = [
                {
                    "description": {"text": f"{f.fix.message} ({f.fix.applicability})"},
                    "artifactChanges": [
                        {
                            "artifactLocation": {"uri": uri},
                            "replacements": [
                                {
                                    "deletedRegion": _region(edit.location, edit.end_location),
                                    "insertedContent": {"text": edit.content},
                                }
                                for edit in f.fix.edits
                            ],
                        }
                    ],
                }
            ]
        results.append(result)
    notifications = [
        {"level": "error", "message": {"text": str(error)}} for error in report.errors
    ]
    run = {
        "tool": {
            "driver": {
                "name": "ampmigrate",
                "version": __version__,
                "informationUri": "https://github.com/ampmigrate/ampmigrate",
                "rules": rules,
            }
        },
        "results": results,
    }
    if notifications:
        run["invocations"] = [{"executionSuccessful": False, "toolExecutionNotifications": notifications}]
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"

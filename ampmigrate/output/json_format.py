"""A JSON array in ruff's shape: code, message, filename, location, end_location, fix, url.

In a notebook, `cell` is the 1-based cell, and locations (also the fix's edits) are relative to it.
"""

import json
import os

from ampmigrate.catalogue import DOCS_URL
from ampmigrate.diagnostics import Finding, Location
from ampmigrate.output import Report


def _location(location: Location) -> dict:
    return {"column": location.column, "row": location.row}


def finding_dict(finding: Finding) -> dict:
    fix = None
    if finding.fix is not None:
        fix = {
            "applicability": finding.fix.applicability,
            "edits": [
                {
                    "content": edit.content,
                    "end_location": _location(edit.end_location),
                    "location": _location(edit.location),
                }
                for edit in finding.fix.edits
            ],
            "message": finding.fix.message,
        }
    return {
        "cell": finding.cell,
        "code": finding.code,
        "end_location": _location(finding.end_location),
        "filename": os.path.abspath(finding.path),
        "fix": fix,
        "location": _location(finding.location),
        "message": finding.message,
        "no_fix_reason": finding.no_fix_reason if finding.fix is None else None,
        "noqa_row": finding.noqa_row,
        "severity": finding.severity,
        "url": DOCS_URL.format(code=finding.code),
    }


def render(report: Report) -> str:
    return json.dumps([finding_dict(f) for f in report.findings], indent=2) + "\n"

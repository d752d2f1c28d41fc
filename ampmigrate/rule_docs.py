"""`ampmigrate rule`: a catalogue entry rendered for a terminal (or as JSON)."""

from __future__ import annotations

import json
import textwrap
from typing import List

from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from ampmigrate.catalogue import FAMILIES, RuleDoc


def render_rule(doc: RuleDoc, console: Console = None) -> None:
    console = console or Console()
    title = Text(f"{doc.code} ({doc.name})", style="bold")
    console.print(title)
    console.print(Text(f"family: {doc.family} {FAMILIES[doc.family]}  ·  fix: {doc.fix}  ·  severity: {doc.severity}", style="dim"))
    console.print()
    console.print(Markdown(doc.summary))
    console.print()
    console.print(Text("Why", style="bold"))
    console.print(Markdown(doc.why.strip()))
    for number, example in enumerate(doc.examples, start=1):
        settings = ", ".join(f"{k}={v}" for k, v in example.settings)
        suffix = f" ({settings})" if settings else ""
        console.print()
        console.print(Text(f"Example {number}{suffix}", style="bold"))
        console.print(Panel(Syntax(example.before.strip("\n"), "python", theme="ansi_dark"), title="before", title_align="left"))
        if example.after != example.before:
            console.print(Panel(Syntax(example.after.strip("\n"), "python", theme="ansi_dark"), title="after", title_align="left"))
        else:
            console.print(Text("  (left unchanged)", style="dim"))
    console.print()
    console.print(Text(doc.url, style="dim"))


def render_rule_list(docs: List[RuleDoc], console: Console = None) -> None:
    """One heading line per rule and its summary indented below: readable at 80 columns (a
    five-column table squeezes the summaries into a narrow column there)."""
    console = console or Console()
    for doc in sorted(docs, key=lambda d: d.code):
        heading = Text()
        heading.append(doc.code, style="bold")
        heading.append(f" {doc.name}")
        heading.append(f"  (fix: {doc.fix}, {doc.severity})", style="dim")
        console.print(heading)
        summary = textwrap.fill(doc.summary, width=max(40, console.width - 1), initial_indent="    ", subsequent_indent="    ")
        console.print(Text(summary), soft_wrap=True)


def rules_json(docs: List[RuleDoc]) -> str:
    return json.dumps(
        [
            {
                "code": d.code,
                "name": d.name,
                "family": d.family,
                "summary": d.summary,
                "why": d.why.strip(),
                "fix": d.fix,
                "severity": d.severity,
                "url": d.url,
                "examples": [{"before": e.before, "after": e.after, "settings": dict(e.settings)} for e in d.examples],
            }
            for d in sorted(docs, key=lambda d: d.code)
        ],
        indent=2,
    )

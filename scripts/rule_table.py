"""Print the README's rule table from the catalogue (tests/test_readme.py keeps them in sync)."""

from ampmigrate.catalogue import FAMILIES, load_catalogue


def rule_table() -> str:
    lines = ["| code | name | fix | severity | what |", "| --- | --- | --- | --- | --- |"]
    for code, doc in sorted(load_catalogue().items()):
        summary = doc.summary.replace("|", "\\|")
        lines.append(f"| {code} | `{doc.name}` | {doc.fix} | {doc.severity} | {summary} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rule_table(), end="")

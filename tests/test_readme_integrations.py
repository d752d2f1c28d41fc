"""The README's integration snippets are copy-pasted by users: keep them valid."""

from __future__ import annotations

import re

import pytest
import yaml

from ampmigrate import config
from ampmigrate.config import load_settings

from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTION = README.partition("## Integrations")[2].split("\n## ", 1)[0]


def _blocks(language: str):
    return re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.S)


def test_the_section_exists():
    assert SECTION.strip()


def test_the_configuration_example_loads_and_the_table_lists_every_key(tmp_path):
    (example,) = [block for block in _blocks("toml") if "[tool.ampmigrate]" in block]
    (tmp_path / "pyproject.toml").write_text(example, encoding="utf-8")
    settings = load_settings(str(tmp_path / "pyproject.toml"))
    assert settings.ignore == ("AMP4",) and settings.target_dtype == "bfloat16"
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", SECTION, flags=re.M))
    assert documented == set(config._KEYS)


def test_the_pre_commit_snippet_names_the_hooks_this_repository_defines():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    defined = {hook["id"] for hook in hooks}
    (snippet,) = [block for block in _blocks("yaml") if "repos:" in block]
    used = {hook["id"] for repo in yaml.safe_load(snippet)["repos"] for hook in repo["hooks"]}
    assert used == defined == {"ampmigrate", "ampmigrate-fix"}
    for hook in hooks:
        assert hook["language"] == "python" and hook["types_or"] == ["python", "pyi"]
        assert hook["require_serial"] is False


@pytest.mark.parametrize("fmt", ["github", "sarif"])
def test_the_workflows_use_real_options(fmt):
    workflows = [yaml.safe_load(block) for block in _blocks("yaml") if "jobs:" in block]
    commands = [step["run"] for w in workflows for job in w["jobs"].values() for step in job["steps"] if "run" in step]
    assert any(f"ampmigrate check --output-format {fmt}" in command for command in commands)
    if fmt == "sarif":
        uploads = [step for w in workflows for job in w["jobs"].values() for step in job["steps"] if "upload-sarif" in step.get("uses", "")]
        assert uploads and uploads[0]["with"]["sarif_file"] == "ampmigrate.sarif"

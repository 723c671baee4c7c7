"""What the user-facing docs tell a newcomer to type or expect matches what the project ships: install
commands name a distribution that exists here with that extra, the sample figures are the chart's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from sessionmem_client.kubectl import EXTRA_HINT

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `pip install <target>[extra]`, the target quoted or not.
_PIP_EXTRA = re.compile(r"pip install '?\"?([^\s'\"\[]+)\[([a-z0-9-]+)\]")


def pip_installs() -> list[tuple[str, str, str]]:
    """(where, target, extra) for every `pip install X[extra]` in the docs and the plugin's own hint."""
    sources = [(doc.name, doc.read_text(encoding="utf-8")) for doc in DOCS] + [("EXTRA_HINT", EXTRA_HINT)]
    return [(where, m.group(1), m.group(2)) for where, text in sources for m in _PIP_EXTRA.finditer(text)]


def test_every_pip_install_names_a_distribution_of_this_repository_with_that_extra() -> None:
    installs = pip_installs()
    assert any(where == "kubectl.md" and extra == "kubectl" for where, _, extra in installs)
    for where, target, extra in installs:
        # No sessionmem distribution is on a package index: an install is of a folder of this checkout.
        project = REPO / target / "pyproject.toml"
        assert project.is_file(), f"{where}: pip install {target}[{extra}] names no distribution of this repository"
        extras = tomllib.loads(project.read_text(encoding="utf-8"))["project"].get("optional-dependencies", {})
        assert extra in extras, f"{where}: {target} has no extra {extra!r}"


def test_the_sample_status_shows_the_charts_default_quotas() -> None:
    values = yaml.safe_load((REPO / "charts" / "sessionmem" / "values.yaml").read_text(encoding="utf-8"))
    quota = values["proxy"]["quota"]
    text = (REPO / "docs" / "kubectl.md").read_text(encoding="utf-8")
    sample = re.search(r"^support-agent\s+session\s.*$", text, re.MULTILINE)
    assert sample is not None
    used = re.findall(r"\b\d+/(\d+)\b", sample.group(0))
    assert used == [str(quota["conversations"]), str(quota["bytes"])]

"""Release metadata, checked against the Comfy Registry's rules that hold offline: a node id and a semantic
version it accepts, a version that only grows (the changelog's newest equals pyproject's), the publisher and
display name, an icon file in the repository within the Registry's size limit, a licence file, a publishing
workflow that runs on a change of pyproject.toml, and no install-time or run-time pip."""
import re
import struct
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT, COMFY = PYPROJECT["project"], PYPROJECT["tool"]["comfy"]
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# What the pack's own code runs in ComfyUI: everything but the tests, the developer tools and the bench.
NOT_LOADED = {"tests", "tools", "bench", ".ci", ".github", "artifacts", ".browser"}


def version(text):
    match = VERSION.match(text)
    assert match, f"{text!r} is not MAJOR.MINOR.PATCH"
    return tuple(int(x) for x in match.groups())


def changelog_versions():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^## (\S+) - \d{4}-\d{2}-\d{2}$", text, re.M)]


def test_node_id_and_version_follow_the_registry_rules():
    name = PROJECT["name"]
    assert len(name) < 100 and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*([._-][A-Za-z0-9]+)*", name), name
    assert "comfyui" not in name.lower()
    version(PROJECT["version"])


def test_the_version_grows_and_the_changelog_names_it():
    versions = changelog_versions()
    assert versions, "CHANGELOG.md has no '## X.Y.Z - YYYY-MM-DD' entries"
    assert versions[0] == PROJECT["version"], f"newest changelog entry {versions[0]} != pyproject {PROJECT['version']}"
    parsed = [version(v) for v in versions]
    assert all(a > b for a, b in zip(parsed, parsed[1:])), f"changelog versions do not decrease: {versions}"


def test_publisher_display_name_description_and_repository():
    assert re.fullmatch(r"[a-z][a-z0-9-]*", COMFY["PublisherId"]), COMFY["PublisherId"]
    assert COMFY["DisplayName"].strip()
    assert 20 <= len(PROJECT["description"]) <= 300
    assert PROJECT["urls"]["Repository"].startswith("https://github.com/")
    assert COMFY["requires-comfyui"].startswith(">=")


def test_the_icon_is_a_file_of_this_repository_within_the_registrys_limits():
    repo = PROJECT["urls"]["Repository"].removeprefix("https://github.com/")
    prefix = f"https://raw.githubusercontent.com/{repo}/main/"
    assert COMFY["Icon"].startswith(prefix), COMFY["Icon"]
    icon = ROOT / COMFY["Icon"].removeprefix(prefix)
    assert icon.is_file(), icon
    data = icon.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "the icon is a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert 64 <= width <= 800 and 64 <= height <= 400, (width, height)


def test_licence_file_matches_the_licence_field():
    assert PROJECT["license"] == {"file": "LICENSE"}
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text
    assert "License :: OSI Approved :: MIT License" in PROJECT["classifiers"]


def test_the_publishing_workflow_runs_the_registrys_action_on_a_change_of_pyproject():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "publish.yml").read_text(encoding="utf-8"))
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert triggers["push"]["paths"] == ["pyproject.toml"] and triggers["push"]["branches"] == ["main"]
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    publish = [s for s in steps if str(s.get("uses", "")).startswith("Comfy-Org/publish-node-action@")]
    assert len(publish) == 1
    assert publish[0]["with"]["personal_access_token"] == "${{ secrets.REGISTRY_ACCESS_TOKEN }}"
    assert any(str(s.get("uses", "")).startswith("actions/checkout@") for s in steps)


def test_nothing_installs_packages_at_install_or_run_time():
    assert not (ROOT / "install.py").exists(), "ComfyUI-Manager runs install.py at install time"
    requirements = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    assert requirements == [], "the pack needs nothing beyond ComfyUI"
    assert PROJECT["dependencies"] == []
    pattern = re.compile(r"\bpip\b.*\binstall\b|subprocess|os\.system|os\.popen|ensurepip|pip\.main|"
                         r"importlib\.metadata\.distribution|__import__\(['\"]pip")
    loaded = [p for p in ROOT.rglob("*.py") if not (set(p.relative_to(ROOT).parts[:-1]) & NOT_LOADED)]
    assert len(loaded) > 20
    offending = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in loaded
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert offending == [], offending

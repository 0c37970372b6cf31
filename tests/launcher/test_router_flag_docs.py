"""The router's defaults have one source, its clap definitions (router/src/config.rs).
`router/src/server/flags_doc_tests.rs` checks docs/router-http.md's table against them; this
checks the other three places that repeat a router default against that table: the
launcher's help (launcher/options.py), README.md's flag table and docs/processes.md's
router command line. A changed default fails one of the two until every page agrees."""

import re
from pathlib import Path

from launcher.options import OPTIONS, ROUTER

REPO = Path(__file__).resolve().parents[2]
ROUTER_DOC = REPO / "docs" / "router-http.md"
README = REPO / "README.md"
PROCESSES = REPO / "docs" / "processes.md"

# Words that describe a default rather than give one.
_DESCRIPTIONS = {"none", "off", "on", "required", "any", "unlimited"}


def _value(text: str) -> str | None:
    """A default as a comparable value, or None when the text describes one."""
    text = text.strip().strip("`")
    if not text or " " in text or text.lower() in _DESCRIPTIONS or text.isupper() or ".." in text or "|" in text:
        return None
    return text


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def _long(flag_text: str) -> str:
    return flag_text.rsplit("/", 1)[-1].rsplit(", ", 1)[-1]


def router_defaults() -> dict[str, str]:
    """Router flag → its default, for the defaults that are values (docs/router-http.md)."""
    rows = {}
    for line in ROUTER_DOC.read_text().splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [cell.strip() for cell in line.split("|")]
        value = _value(cells[2])
        if value is not None:
            rows[_long(cells[1].split("`")[1])] = value
    return rows


def readme_defaults() -> dict[str, str]:
    """README's flag table: one row may list several flags and as many defaults."""
    rows = {}
    for line in README.read_text().splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [cell.strip() for cell in line.split("|")]
        flags = [_long(flag) for flag in re.findall(r"`(-[^`]+)`", cells[1].split("(")[0])]
        values = [part.strip() for part in cells[2].split(", ")]
        if len(flags) == len(values):
            rows.update({flag: value for flag, value in zip(flags, values) if _value(value) is not None})
    return rows


def processes_defaults() -> dict[str, str]:
    """docs/processes.md's `textgen-router ...` command line: `[--flag DEFAULT]`."""
    text = PROCESSES.read_text()
    command = text[text.index("textgen-router --model-id"):]
    command = command[:command.index("```")]
    rows = {}
    for flag, value in re.findall(r"\[(--[\w-]+) ([^\]]+)\]", command):
        if _value(value) is not None:
            rows[flag] = value
    return rows


def launcher_defaults() -> dict[str, str]:
    return {
        option.long_flag: option.child_default
        for option in OPTIONS
        if ROUTER in option.forward and option.child_default is not None and _value(option.child_default)
    }


def _disagreements(page: dict[str, str], source: dict[str, str]) -> list[str]:
    return [
        f"{flag}: {page[flag]!r}, the router's default is {source[flag]!r}"
        for flag in sorted(page.keys() & source.keys())
        if not _same(page[flag], source[flag])
    ]


def test_the_launcher_names_the_routers_defaults():
    source, launcher = router_defaults(), launcher_defaults()
    assert len(launcher.keys() & source.keys()) >= 15
    assert not launcher.keys() - source.keys(), "router flags the table lacks"
    assert not _disagreements(launcher, source)


def test_the_readme_names_the_routers_defaults():
    source, readme = router_defaults(), readme_defaults()
    assert len(readme.keys() & source.keys()) >= 12
    assert not _disagreements(readme, source)


def test_docs_processes_names_the_routers_defaults():
    source, processes = router_defaults(), processes_defaults()
    assert len(processes.keys() & source.keys()) >= 12
    assert not processes.keys() - source.keys(), "router flags the table lacks"
    assert not _disagreements(processes, source)


def test_a_changed_default_is_caught_on_each_page(monkeypatch):
    """The check can fail: a default that moved in the table disagrees with every page."""
    source = router_defaults()
    moved = {**source, "--payload-limit": "1"}
    for page in (launcher_defaults(), readme_defaults(), processes_defaults()):
        assert _disagreements(page, moved), page


def test_connection_bounds_are_launcher_flags():
    flags = {option.long_flag: option for option in OPTIONS}
    for flag in ("--header-read-timeout", "--body-read-timeout", "--keep-alive-timeout",
                 "--max-connections"):
        assert ROUTER in flags[flag].forward, flag

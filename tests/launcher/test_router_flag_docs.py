"""The launcher's help names the router's defaults; they must be the ones the router
defines. docs/router-http.md's table is checked against the router's clap definitions by
`router/src/server/flags_doc_tests.rs`; this checks the launcher against that table."""

from pathlib import Path

from launcher.options import OPTIONS, ROUTER

DOC = Path(__file__).resolve().parents[2] / "docs" / "router-http.md"


def documented_defaults() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [cell.strip() for cell in line.split("|")]
        flag = cells[1].split("`")[1].rsplit(", ", 1)[-1]
        rows[flag] = cells[2].strip("`")
    return rows


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def test_numeric_router_defaults_in_the_launcher_match_the_router_docs():
    documented = documented_defaults()
    checked = 0
    for option in OPTIONS:
        if ROUTER not in option.forward or option.child_default is None:
            continue
        try:
            float(option.child_default)
        except ValueError:
            continue  # a description ("the whole pool ..."), not a value
        assert option.long_flag in documented, option.long_flag
        assert _same(documented[option.long_flag], option.child_default), (
            option.long_flag, documented[option.long_flag], option.child_default)
        checked += 1
    assert checked >= 10


def test_connection_bounds_are_launcher_flags():
    flags = {option.long_flag: option for option in OPTIONS}
    for flag in ("--header-read-timeout", "--body-read-timeout", "--keep-alive-timeout",
                 "--max-connections"):
        assert ROUTER in flags[flag].forward, flag

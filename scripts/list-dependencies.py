"""Print the runtime dependencies of pyproject.toml, one requirement a line.

The Dockerfile installs them in a layer keyed on pyproject.toml alone, so editing textgen's
sources does not reinstall torch. Usage: python3 scripts/list-dependencies.py pyproject.toml
"""

import sys
import tomllib
from pathlib import Path


def dependencies(pyproject: Path) -> list[str]:
    with pyproject.open("rb") as handle:
        project = tomllib.load(handle).get("project", {})
    return list(project.get("dependencies", []))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: list-dependencies.py PYPROJECT_TOML", file=sys.stderr)
        return 2
    for requirement in dependencies(Path(argv[0])):
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A small Dockerfile reader: instructions with continuation lines joined, stages, ARG
defaults substituted into FROM, RUN commands split on `&&`."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    arguments: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [item for item in self.instructions if item.keyword == keyword]


def instructions(text: str) -> list[Instruction]:
    result, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        result.append(Instruction(keyword.upper(), arguments.strip()))
    return result


def stages(text: str) -> list[Stage]:
    """Stages in order; ARGs declared before the first FROM fill in FROM lines."""
    args: dict[str, str] = {}
    found: list[Stage] = []
    for item in instructions(text):
        if item.keyword == "ARG" and not found:
            name, _, default = item.arguments.partition("=")
            args[name] = default
        elif item.keyword == "FROM":
            words = item.arguments.split()
            words = [word for word in words if not word.startswith("--platform")]
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            found.append(Stage(base, name))
        elif found:
            found[-1].instructions.append(item)
    return found


def run_commands(stage: Stage) -> list[list[str]]:
    """Every command of the stage's RUN instructions, each as argv words."""
    commands = []
    for item in stage.all("RUN"):
        for command in item.arguments.split("&&"):
            words = shlex.split(command)
            if words:
                commands.append(words)
    return commands


def env(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in stage.all("ENV"):
        for word in shlex.split(item.arguments):
            name, _, value = word.partition("=")
            values[name] = value
    return values


def exec_form(item: Instruction) -> list[str]:
    return json.loads(item.arguments)


def read(path: Path) -> list[Stage]:
    return stages(path.read_text())

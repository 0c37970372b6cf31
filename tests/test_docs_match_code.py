"""Docs that name code, and code comments that name docs, must stay true."""

import re
from pathlib import Path

from launcher.options import OPTIONS, UNSUPPORTED

REPO = Path(__file__).resolve().parents[1]

# Files whose comments cite docs by repository path.
CITING = [REPO / "proto" / "generate.proto", *sorted((REPO / "tests").rglob("*.py"))]
COMMENT = re.compile(r"(?:#|//)(.*)$")
CITED_DOC = re.compile(r"[\w./-]+\.md\b")


def test_docs_cited_in_comments_exist_in_the_repository():
    missing = []
    for path in CITING:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            comment = COMMENT.search(line)
            for cited in CITED_DOC.findall(comment.group(1) if comment else ""):
                if "/" in cited and not (REPO / cited).is_file():
                    missing.append(f"{path.relative_to(REPO)}:{number}: {cited}")
                elif "/" not in cited and not list(REPO.glob(f"**/{cited}")):
                    missing.append(f"{path.relative_to(REPO)}:{number}: {cited}")
    assert not missing, missing


def test_readme_lists_as_unimplemented_only_flags_the_launcher_refuses():
    readme = (REPO / "README.md").read_text()
    sentence = re.search(r"TGI flags textgen does not implement yet \(([^)]*)\)", readme)
    assert sentence, "README lost its list of unimplemented TGI flags"
    listed = re.findall(r"`(--[\w-]+)`", sentence.group(1))
    assert listed
    refused = {flag.flag for flag in UNSUPPORTED}
    implemented = {option.long_flag for option in OPTIONS}
    for flag in listed:
        assert flag in refused and flag not in implemented, flag

"""scripts/install-tools.sh, run by `make install-test`: a second run finds everything at its
pinned version and returns at once, leaving tools that run."""

import re
import subprocess
import time

from deploy_tools import REPO_ROOT, TOOLS_BIN, check_tool

SCRIPT = REPO_ROOT / "scripts" / "install-tools.sh"


def _pinned(variable: str) -> str:
    return re.search(rf"^{variable}=(\S+)$", SCRIPT.read_text(), re.MULTILINE).group(1)


def test_rerun_is_fast_and_keeps_pinned_versions():
    start = time.monotonic()
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert elapsed < 30, f"an up-to-date install took {elapsed:.0f} s; it should skip all work"
    assert "building" not in result.stderr, result.stderr  # nothing was rebuilt
    stamps = TOOLS_BIN.parent
    assert (stamps / "helm.version").read_text().strip() == _pinned("HELM_VERSION")
    assert (stamps / "kubeconform.version").read_text().strip() == _pinned("KUBECONFORM_VERSION")
    assert (stamps / "promtool.version").read_text().strip()


def test_installed_tools_run():
    assert check_tool("helm", "version", "--short").startswith("v3.")
    check_tool("kubeconform", "-v")
    assert "promtool" in check_tool("promtool", "--version")

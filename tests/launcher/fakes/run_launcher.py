"""Runs the real launcher `serve()` with the fake shard and router as its children."""

import os
import sys
from pathlib import Path

from launcher.cli import serve
from launcher.commands import Executables

HERE = Path(__file__).parent
fakes = Executables(router=(sys.executable, str(HERE / "fake_router.py")),
                    shard=(sys.executable, str(HERE / "fake_shard.py")))
sys.exit(serve(sys.argv[1:], os.environ, fakes))

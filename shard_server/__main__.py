"""`python -m shard_server serve ...` is the same as `textgen-shard serve ...`."""

import sys

from .cli import main

sys.exit(main())

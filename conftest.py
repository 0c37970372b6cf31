"""Settings every test folder needs before any of them imports the project."""
import os

import torch

# Without a GPU the Triton kernels run through Triton's interpreter, which Triton switches on
# only if this is set before its first import. It lives here, not in tests/shard/, because
# other folders (tests/bench) import shard_server, and with it Triton, earlier.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

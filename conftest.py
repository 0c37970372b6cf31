"""Settings every test folder needs before any of them imports the project."""
import os

import torch

# Without a GPU the Triton kernels run through Triton's interpreter, which Triton switches on
# only if this is set before its first import. It lives here, not in tests/shard/, because
# other folders (tests/bench) import shard_server, and with it Triton, earlier.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs `-n 2`), each worker keeps to its own share of the
    CPUs, and so does every server it starts: the shard sizes its torch threads by its
    affinity. Two workers then compute side by side instead of both spreading over every
    core, where each torch op's threads wait on the other worker's."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    index, count = int(worker["workerid"].removeprefix("gw")), int(worker["workercount"])
    cpus = sorted(os.sched_getaffinity(0))
    share = set(cpus[index % len(cpus)::count])  # never empty: it starts inside `cpus`
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))

"""A correct backend that takes its time: the naive math after a sleep in forward, so a test can
kill a worker or interrupt a client while a case is surely running, without burning CPU.

Named in sweeps as ``sleepy_backend:Sleepy`` (or ``sleepy_backend:make``, the same class;
``tests/`` on PYTHONPATH of the client and the workers). A backend class, as the worker
instantiates nothing else; importing this module imports no torch: only creating a
:class:`Sleepy` does, in a rank process.
``SLEEPY_S`` sets the sleep (default 0.3 s); ``SLEEPY_LOG``, when set, names a file that gets one
line ``<pid> <time>`` at the start of every forward (to see which rank process runs a case);
``SLEEPY_COMPILE_S`` adds that many seconds inside ``compiling()`` to every forward.
"""

import os
import time


class Sleepy:
    """The naive backend (every attribute of it) with a sleep before each forward."""

    name = "sleepy"

    def __init__(self):
        from attnbench.backends.naive import NaiveBackend

        self._naive = NaiveBackend()
        self.keep_mask = self._naive.keep_mask

    def __getattr__(self, attr):  # optional parts of the protocol (backward_from_stats, ...)
        return getattr(self._naive, attr)

    def supports(self, case, device):
        return self._naive.supports(case, device)

    def forward(self, q, k, v, spec):
        path = os.environ.get("SLEEPY_LOG")
        if path:
            with open(path, "a") as fh:
                fh.write(f"{os.getpid()} {time.time():.3f}\n")
        compile_s = float(os.environ.get("SLEEPY_COMPILE_S", "0"))
        if compile_s:  # as a torch.compile'd backend's first call: the worker tells the client
            from attnbench.backends.base import compiling

            with compiling():
                time.sleep(compile_s)
        time.sleep(float(os.environ.get("SLEEPY_S", "0.3")))
        return self._naive.forward(q, k, v, spec)

    def backward(self, ctx, dout):
        return self._naive.backward(ctx, dout)


make = Sleepy  # the name sweeps and benchmarks/dask_overhead.py use

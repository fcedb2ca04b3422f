"""A correct backend that takes its time: the naive math after a sleep in forward, so a test can
kill a worker or interrupt a client while a case is surely running, without burning CPU.

Named in sweeps as ``sleepy_backend:make`` (``tests/`` on PYTHONPATH of the client and the
workers). Importing this module imports no torch: only :func:`make` does, in a rank process.
``SLEEPY_S`` sets the sleep (default 0.3 s); ``SLEEPY_LOG``, when set, names a file that gets one
line ``<pid> <time>`` at the start of every forward (to see which rank process runs a case).
"""

import os
import time


def make():
    from attnbench.backends.naive import NaiveBackend

    class Sleepy(NaiveBackend):
        name = "sleepy"

        def forward(self, q, k, v, spec):
            path = os.environ.get("SLEEPY_LOG")
            if path:
                with open(path, "a") as fh:
                    fh.write(f"{os.getpid()} {time.time():.3f}\n")
            time.sleep(float(os.environ.get("SLEEPY_S", "0.3")))
            return super().forward(q, k, v, spec)

    return Sleepy()

"""Context and tensor parallelism over torch.distributed, on warm rank pools.

A case with ``cp * tp > 1`` runs on every rank of a ``cp * tp`` rank pool
(:mod:`attnbench.execution.pool`) through :func:`attnbench.execution.multi.run_parallel_case`:

* :mod:`~attnbench.parallel.group` -- the process group (created once per pool: TCPStore
  rendezvous, gloo / NCCL / gloo with host staging), CP x TP sub-groups, the few communication
  operations the algorithms use.
* :mod:`~attnbench.parallel.layout` -- which sequence segments and heads each rank holds
  (contiguous chunks, zigzag chunks, GQA-whole head slices, MQA replication; a packed case's
  chunks per document).
* :mod:`~attnbench.parallel.ring` -- ring and zigzag CP: K/V passed around, partial outputs
  merged by log-sum-exp, dK/dV sent home; each block's dropout RNG state replayed in backward.
* :mod:`~attnbench.parallel.allgather` -- all-gather CP: K/V gathered, local queries attend.
* :mod:`~attnbench.parallel.tp` -- TP: head sharding; MQA's replicated K/V gradients summed.
* :mod:`~attnbench.parallel.parity` -- the bound of a split result against CP = TP = 1.

Masks, ALiBi and dropout are functions of *global* positions and heads
(:class:`attnbench.problem.AttnSpec` offsets), which is what makes a split run reproduce the
single-device problem exactly up to rounding.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "group": ("Comm", "PeerFailed", "get_world", "rank_layout"),
    "layout": ("Shard",),
    "parity": ("reference_roundings", "summed_partials"),
})

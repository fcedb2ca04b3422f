"""The generator a hidden dropout mask is drawn from, captured and replayed.

Hidden-mask kernels draw their mask from the device's default generator: on CPU torch's generator
(SDPA's math path, ``bernoulli_``); on CUDA the Philox seed and offset that flash-attn, cuDNN,
SDPA's fused kernels and xformers read from ``torch.cuda``'s generator. The single-device runner
captures its state right before the judged forward; :mod:`attnbench.accuracy.dropout_probe`
replays forwards under it, or draws independent states for its statistics.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch


def default_generator(device: torch.device | str) -> torch.Generator:
    """The generator a kernel on ``device`` draws dropout from when given none: torch's CPU
    generator (``torch.get_rng_state()``) or the device's CUDA generator
    (``torch.cuda.get_rng_state(device)``: Philox seed and offset)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        torch.cuda.init()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    raise NotImplementedError(f"no RNG replay for {device.type!r} devices")


@dataclass(frozen=True)
class RngState:
    """A snapshot of the generator a backend's dropout draws from.

    The harness captures one right before the forward call it judges::

        rng = RngState.capture(device)
        fwd = backend.forward(q, k, v, spec)

    and :func:`judge_dropout` reruns forwards under it (``with rng.replayed(): ...``).
    """

    generator: torch.Generator
    state: torch.Tensor
    """``generator.get_state()`` at capture (CPU: Mersenne Twister; CUDA: seed and offset)."""

    @classmethod
    def capture(cls, device: torch.device | str) -> "RngState":
        generator = default_generator(device)
        return cls(generator, generator.get_state())

    @classmethod
    def seeded(cls, device: torch.device | str, seed: int) -> "RngState":
        """The state ``manual_seed(seed)`` would give the device's generator, leaving it as is."""
        generator = default_generator(device)
        scratch = torch.Generator(device=generator.device).manual_seed(seed)
        return cls(generator, scratch.get_state())

    @classmethod
    def for_call(cls, device: torch.device | str, dropout_seed: int, rank: int = 0) -> "RngState":
        """The state a case's judged call runs under on rank ``rank`` (0 on one device): derived
        from the case's ``dropout_seed`` and the rank, so a rerun draws the same masks and every
        rank of a CP/TP run draws its own (Megatron's model-parallel RNG offsets its seed per
        TP rank for the same reason); the probes replay it per rank."""
        return cls.seeded(device, (dropout_seed * 1_000_003 + 7919 * rank + 1) & 0x7FFFFFFF)

    def restore(self) -> None:
        self.generator.set_state(self.state)

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the body under this state; afterwards the generator is where it was before, so
        probing does not shift what the rest of the run draws."""
        before = self.generator.get_state()
        self.restore()
        try:
            yield
        finally:
            self.generator.set_state(before)

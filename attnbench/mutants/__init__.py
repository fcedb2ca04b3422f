"""Backends with one deliberate, plausible bug each: the bugs the selftest must catch.

Each comes from a catalogue of attention bug classes seen in public reports
(:mod:`attnbench.mutants.catalogue`). ``attnbench selftest`` runs them through the standard
sweep's checks to show that every class is caught, and by how much.

Modules: :mod:`~.patch` (how a mutant edits correct code), :mod:`~.base` (the correct
recomputing backend the backward mutants edit), :mod:`~.backward`, :mod:`~.forward`,
:mod:`~.parallel` (CP/TP algorithm mutants), :mod:`~.quantized` (a bug only captured
activations show, outside the selftest's catalogue). Nothing here is imported unless a mutant
is used.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "backward": ("NanTailBlock",),
    "catalogue": ("CAPTURED_ONLY", "CATALOGUE", "CONTROL", "FUSED_CONTROL",
                  "HIDDEN_DROPOUT_CONTROL", "LONG_SEQLEN", "SEEDED_DROPOUT_CONTROL", "Mutant",
                  "by_name"),
    "dropout": ("CpDropoutLocalOffsets", "DropoutBatchShareMask", "DropoutHeadsShareMask",
                "DropoutKeepP", "DropoutRenormalised", "DropoutSeedIgnored", "HiddenSeedDropout",
                "HiddenTorchRngDropout"),
    "patch": ("MutationError", "mutated"),
    "quantized": ("KInt8Unsmoothed", "int8_per_channel"),
})

"""attnbench: is a fused-attention kernel right, and how fast is it."""

__version__ = "0.1.0"

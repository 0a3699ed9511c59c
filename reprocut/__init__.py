"""reprocut: turn a PyTorch script that dies with a CUDA error into a minimal, verified repro.py."""

__version__ = "0.1.0"

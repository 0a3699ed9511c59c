"""reprocut: turn a PyTorch script that dies with a CUDA error into a minimal, verified repro.py."""

import os

__version__ = "0.1.0"

# reprocut's own files: their frames are never the user's, and child processes import from beside it
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

"""reprocut: turn a PyTorch script that dies with a CUDA error into a minimal, verified repro.py."""

import os

__version__ = "0.1.0"

# reprocut's own files: their frames are never the user's, and child processes import from beside it
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def silence_torch_import_warnings() -> None:
    """For reprocut's own processes (the command, the fork server), never the user's: torch
    warns "Failed to initialize NumPy" when it is imported without a working numpy, which in
    the user's process is the script's own output and in reprocut's is noise."""
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

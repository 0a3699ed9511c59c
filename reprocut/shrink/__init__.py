"""Stage 3, op level: a ReproCase shrunk to the smallest that fails the same way, written as repro.py."""

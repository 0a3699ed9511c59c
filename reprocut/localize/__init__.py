"""Stage 2, from a failed run to the first faulting op, with its real inputs, as a Failure on disk."""

"""Stage 3, source level: the user's script cut down while it fails the same way (custom kernels)."""

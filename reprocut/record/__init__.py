"""Stage 1, the user's process: run the script as python would, record every op per step, catch the error."""

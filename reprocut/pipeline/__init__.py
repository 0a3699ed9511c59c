"""A recording to a verified repro.py and report.md: shrink, check and report wired, phases timed."""

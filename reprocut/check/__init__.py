"""Run code in a disposable process and say how it failed: the oracle, its fork server, plain runs."""

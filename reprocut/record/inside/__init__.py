"""The user's process: the script runs here, under the recorder, with torch hooks on every op.

`python -m reprocut.record.inside.child` is started by parent/runner.py (or, under torchrun, by
ranks/rank.py). Everything here runs beside the user's code, in the user's threads and at the
user's ops, so it has to stay cheap and must never raise into the script: recorder.py composes
the hooks (ops.py, calls.py, tripwire.py, finite_watch.py, nonfinite.py), which share the run's
state through state.py and write what they find to the run directory (trace.py, outcome.py).
"""

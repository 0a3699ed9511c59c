"""The user's process: the script runs here, under the recorder, with torch hooks on every op.

`python -m reprocut.record.inside.child` is started by parent/runner.py (or, under torchrun, by
ranks/rank.py). Everything here runs beside the user's code, in its threads and at its ops, so it
has to stay cheap: recorder.py composes the hooks (ops.py, calls.py, tripwire.py, finite_watch.py,
nonfinite.py) around one RunState (state.py), hands them what they ask of the run (where.py,
public.py, outcome.py), and they write what they find to the run directory (trace.py, outcome.py).
"""

"""Stage 1: run the script as python would, record every op per step, catch the error.

Three sides, one sub-package each, by the process its modules run in:
- inside/: the user's process. `python -m reprocut.record.inside.child` runs the script there
  under the recorder (torch modes, hooks and the tripwire) and writes what it saw.
- parent/: reprocut's own process. It reads the launch command and starts the child, teeing
  its output; a crash of the child is a result there, never an exception.
- ranks/: `reprocut record -- torchrun ...`. The parent runs the real torchrun and reads every
  rank's result; torchrun starts the rank bootstrap, which starts one child per rank.
"""

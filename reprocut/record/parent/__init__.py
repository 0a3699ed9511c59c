"""reprocut's own process: read the launch command, start the user's process, survive it.

launch.py parses `reprocut record ... train.py ARGS` as python would; runner.py starts
`python -m reprocut.record.inside.child` in a process group of its own and reads back what it
left. Nothing here imports torch at module level or runs the user's code: a CUDA fault, an abort
or a SIGKILL of the child is data for the localizer, not an error here.
"""

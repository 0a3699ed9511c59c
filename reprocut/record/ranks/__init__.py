"""torchrun jobs: `reprocut record -- torchrun ... train.py`, on the parent's side and per rank.

torchrun.py (parent) reads the launcher's command line and rewrites it so that torchrun starts
rank.py instead of the script; job.py (parent) runs the real torchrun, owns the job's folder and
reads each rank's result. rank.py runs in the process torchrun starts for each rank: a bootstrap
that never imports torch and runs the script as one child (parent/runner.py) into its own folder.
"""

"""Starts a child of its own, says who is in its process group, then sleeps: killing reprocut
must end all of them."""

import os
import subprocess
import sys
import time

report = sys.argv[1]
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(report + ".tmp", "w") as out:
    out.write(f"{os.getpid()} {os.getpgrp()} {helper.pid}\n")
os.replace(report + ".tmp", report)
time.sleep(120)

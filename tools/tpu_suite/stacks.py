"""Run a Python script with every thread's stack dumped every N seconds to a file (where a slow run waits).

    python3 tools/tpu_suite/stacks.py SECONDS OUTFILE SCRIPT [ARGS...]
"""
import faulthandler
import runpy
import sys

every, out, script, *rest = sys.argv[1:]
faulthandler.dump_traceback_later(float(every), repeat=True, file=open(out, "w"))  # noqa: SIM115 (held for the run)
sys.argv = [script, *rest]
runpy.run_path(script, run_name="__main__")

"""Run a module under cProfile counting each thread's CPU time (``time.thread_time``), not
wall time: on a loaded machine a wall-clock profile charges a function for the time its
thread waited for a core or the GIL. Only the main thread is profiled (the service's event
loop; its worker threads' Parquet work shows in ``perf``). The stats are written on exit
(SIGTERM and SIGINT included).

    python -m benchmarks.profiled OUT.prof -m MODULE ARGS...
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
import time


def main() -> None:
    out, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(__doc__)
    sys.argv = [module, *rest]
    prof = cProfile.Profile(time.thread_time)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    prof.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        prof.disable()
        prof.dump_stats(out)


if __name__ == "__main__":
    main()

"""Functions the lane host's unit tests run as function jobs (tests/test_lane_workers.py)."""

from __future__ import annotations

import os
import sys
import threading
import time


def report(name: str = "SECRET") -> dict:
    print(f"hello from {os.getpid()}")
    return {"pid": os.getpid(), "env": os.environ.get(name), "leak": os.environ.get("LEAK"), "cwd": os.getcwd()}


def leave_a_mess() -> dict:
    out = report()
    os.environ["LEAK"] = "left by an earlier job"
    os.chdir("/")
    return out


def boom() -> None:
    raise ValueError("boom in a lane")


def hang(pidfile: str) -> None:
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)


def exit_hard(code: int) -> None:
    print("going", flush=True)
    os._exit(code)


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def leave_a_thread() -> dict:
    threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    return report()


def host_main(workdir: str, pidfile: str) -> None:
    """A lane host in a process of its own (to be SIGKILLed), with one hung call."""
    from raylane.jobs.lane import Host
    from tests.test_lane_host import MemoryStore, enqueue

    store = MemoryStore()
    enqueue(store, "hung", "tests.lane_funcs:hang", args={"pidfile": pidfile})
    Host(store, "cpu", "raylane-lane-cpu-1", slots=2, idle_s=600, workdir=__import__("pathlib").Path(workdir)).run()
    sys.exit(0)

"""A long-running query stops after its current micro-batch on SIGTERM or Ctrl-C: the signal sets the
stop event while the block runs, and the former handlers come back after it."""

import os
import signal
import threading

from spark_jobs.runtime.stopping import stop_on_signals


def test_sigterm_and_sigint_set_the_stop_event_then_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        stop = threading.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), sig)
            assert stop.wait(5)
    assert {s: signal.getsignal(s) for s in before} == before


def test_off_the_main_thread_nothing_is_installed():
    seen = []

    def run():
        stop = threading.Event()
        with stop_on_signals(stop):
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before]

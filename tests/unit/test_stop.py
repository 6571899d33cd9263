"""rtj_worker.stop: a rank asked to stop must leave, even when inprocess.Wrapper interrupts it.

The wrapper interrupts the training thread with asynchronous exceptions (PyThreadState_SetAsyncExc)
when a peer faults. CI caught one landing between a stopping rank's log line and its exit: the rank
went into an in-process restart instead and ended 30 s later with 1, not 143. Here the same CPython
call interrupts `_exit` while it writes its event."""

from __future__ import annotations

import ctypes
import threading
import time

from rtj_worker import stop as stop_module


class Interrupted(Exception):
    pass


def test_an_asynchronous_exception_during_the_exit_still_exits_with_the_code(monkeypatch) -> None:
    writing, exits, writes = threading.Event(), [], []

    def slow_emit(*_: object, **__: object) -> None:
        writes.append(1)
        writing.set()
        while len(writes) == 1:  # the first write, until the exception arrives (at a bytecode boundary)
            time.sleep(0.01)

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit  # ends the thread, as os._exit would end the process

    monkeypatch.setattr(stop_module.events, "emit", slow_emit)
    monkeypatch.setattr(stop_module.os, "_exit", fake_exit)
    request = stop_module.StopRequest(None)
    errors: list[BaseException] = []

    def rank() -> None:
        try:
            request._exit(143, "the training loop failed while stopping")
        except SystemExit:
            pass
        except BaseException as exc:  # what escaped instead of the exit
            errors.append(exc)

    thread = threading.Thread(target=rank, daemon=True)
    thread.start()
    assert writing.wait(5)
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                      ctypes.py_object(Interrupted)) == 1
    thread.join(5)
    assert exits == [143] and not errors, (exits, errors)
    assert len(writes) == 2  # the interrupted event was written again (CI: a rank exited with none)

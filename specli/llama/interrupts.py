"""Ctrl-C that lands while llama.cpp calls back into Python.

Python runs a signal's handler in the main thread at the next bytecode it evaluates. While
llama.cpp is inside a decode it may call back into Python (its log callback: on a CUDA build
it logs during decodes), and a KeyboardInterrupt raised in such a callback cannot cross the C
frames below it: ctypes prints "Exception ignored on calling ctypes callback function" and the
interrupt is lost. `guard_callbacks` installs a SIGINT handler that, inside one of the
registered callbacks, has the signal delivered again a moment later instead of raising: it
is raised once the main thread runs Python outside them, when llama.cpp has returned.
"""

from __future__ import annotations

import _thread
import signal
import threading
from types import CodeType, FrameType
from typing import Callable

_CALLBACKS: set[CodeType] = set()


def register(callback: Callable[..., object]) -> Callable[..., object]:
    """Mark a function llama.cpp calls back as one a KeyboardInterrupt must not be raised in."""
    _CALLBACKS.add(callback.__code__)
    return callback


REDELIVER_SECONDS = 0.001


def _inside_callback(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _CALLBACKS:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _inside_callback(frame):
        # Delivered again from another thread: the handler runs at the main thread's next
        # bytecode, which is outside the callback unless llama.cpp has called it again.
        again = threading.Timer(REDELIVER_SECONDS, _thread.interrupt_main, args=(signum,))
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt


def guard_callbacks() -> None:
    """Route SIGINT through `_on_sigint` where Python's own handler is in place (in the main
    thread only; a handler someone else installed is left alone). Outside the registered
    callbacks it raises KeyboardInterrupt as Python's own does."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)

"""Ctrl-C that arrives while llama.cpp has called back into Python is not lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import ctypes, signal, time
    from specli.llama import interrupts

    @interrupts.register
    def callback(value):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while C code is calling back into Python
        return None

    thunk = ctypes.CFUNCTYPE(None, ctypes.c_int)(callback)
    if GUARD:
        interrupts.guard_callbacks()
    try:
        thunk(1)  # through C, as llama.cpp calls its log callback
        time.sleep(2)  # the caller goes on: the interrupt must reach it
        print("lost")
    except KeyboardInterrupt:
        print("interrupted")
""")


def run(guard: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"GUARD = {guard}\n" + SCRIPT], capture_output=True, text=True,
                          timeout=60)


def test_an_interrupt_inside_a_callback_is_raised_once_the_callback_has_returned():
    done = run(guard=True)
    assert done.stdout.strip() == "interrupted", done.stderr
    assert "Exception ignored" not in done.stderr


def test_without_the_guard_python_loses_it():  # the failure the guard exists for
    done = run(guard=False)
    assert done.stdout.strip() == "lost"
    assert "Exception ignored" in done.stderr and "KeyboardInterrupt" in done.stderr


def test_a_handler_someone_else_installed_is_left_alone():
    script = ("import signal\nfrom specli.llama import interrupts\nmine = lambda *a: None\n"
              "signal.signal(signal.SIGINT, mine)\ninterrupts.guard_callbacks()\n"
              "print(signal.getsignal(signal.SIGINT) is mine)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr

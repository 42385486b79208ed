"""The events of generations in slots wait for the next shared decode's start (worker.Outbox)."""

from __future__ import annotations

import asyncio

from specli.serve.worker import Outbox, Relay


def test_events_wait_for_the_outbox_and_an_end_sends_everything_in_order():
    loop = asyncio.new_event_loop()
    try:
        outbox = Outbox()
        got: list[object] = []
        first, second = Relay(loop, lambda e: got.append(("a", e)), outbox), Relay(loop, lambda e: got.append(("b", e)), outbox)
        first._send(1)
        second._send(2)
        first._send(3)
        loop.run_until_complete(asyncio.sleep(0))
        assert got == []  # held: no decode has started
        outbox.send()  # (SharedSteps.before_decode)
        loop.run_until_complete(asyncio.sleep(0))
        assert got == [("a", 1), ("b", 2), ("a", 3)]
        second._send(4)
        second.finish(None)  # the end sends what is held, without a decode
        loop.run_until_complete(asyncio.sleep(0))
        assert got[3:] == [("b", 4), ("b", None)]
        alone: list[object] = []
        Relay(loop, alone.append)._send(5)  # without an outbox: at once
        loop.run_until_complete(asyncio.sleep(0))
        assert alone == [5]
    finally:
        loop.close()
    outbox.put(loop, got.append, 6)
    outbox.send()  # a closed loop: nobody to hear it, and no error for the step
    assert got[-1] == ("b", None)

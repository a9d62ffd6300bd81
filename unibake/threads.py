"""The one way work is handed between threads: a bounded queue with an end and an error.

Two shapes, both over :class:`Handoff`:

* :func:`read_ahead`: a producer (the engine's save stream) runs in a thread, the caller iterates;
  the engine never waits on our hashing and compression, and we never wait on its next write.
* :func:`consume_in_thread`: the caller puts items, a consumer runs in a thread (the sha256
  updates, which let go of the GIL; an engine's load of a stream); ``close()`` returns what the
  consumer returned or raises what it raised.

Memory stays bounded by the queue's depth; an error on either side reaches the other promptly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from queue import Empty, Full, Queue
from typing import Generic, TypeVar

from .errors import HandoffAborted

T = TypeVar("T")
R = TypeVar("R")
_END = object()


class Thread(threading.Thread):
    """A thread whose ``join()`` and ``is_alive()`` an interrupt cannot fool. Python 3.11's ``join``, cut
    short by an exception raised in it (the KeyboardInterrupt of Ctrl-C or SIGTERM), takes the thread
    for ended while it still runs (it releases the lock it waited on, which the running thread holds,
    for bpo-45274): from then on ``is_alive()`` said False and every ``join()`` returned at once, so a
    clean-up that waits for the thread went on beside it. Both go here by an event the thread sets as
    its work ends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ended = threading.Event()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._ended.set()

    def join(self, timeout: float | None = None) -> None:
        if self.ident is None:  # never started (an interrupt between its making and its start): nothing to wait for
            return
        if self._ended.wait(timeout):  # (an interrupt in the wait leaves the event as it was)
            super().join()  # its last moments, its work done

    def is_alive(self) -> bool:
        return self.ident is not None and not self._ended.is_set()


class Handoff(Generic[T]):
    """A bounded queue from one thread to another that can be ended, failed and abandoned."""

    def __init__(self, depth: int):
        self._queue: Queue = Queue(maxsize=depth)
        self.abandoned = threading.Event()  # the receiving side stopped taking items

    def put(self, item: object) -> bool:
        """Hand ``item`` over; False once the receiver has stopped (it will take nothing more)."""
        while not self.abandoned.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except Full:  # look at ``abandoned`` again
                continue
        return False

    def end(self, error: BaseException | None = None) -> None:
        self.put(error if error is not None else _END)

    def items(self) -> Iterator[T]:
        """What was put, until the end; raises an error that was put instead. Taken with a time-out, as
        ``put`` hands over: an interrupt raised in the putting thread inside the queue's ``notify`` leaves
        a stale waiter in it, and the next notify wakes that one, not this thread (an interrupted round
        trip hung in its clean-up, the hashing thread never woken for the end it was handed)."""
        while True:
            try:
                item = self._queue.get(timeout=0.1)
            except Empty:  # look at the queue again
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def abandon(self) -> None:
        """The receiver stops: a blocked ``put`` returns, and what was queued is dropped."""
        self.abandoned.set()
        while True:
            try:
                self._queue.get_nowait()
            except Empty:
                return


def counted(chunks: Iterable[bytes], advance: Callable[[int], object]) -> Iterator[bytes]:
    """``chunks`` passed on, each one's length told to ``advance`` first (progress, byte counts)."""
    for chunk in chunks:
        advance(len(chunk))
        yield chunk


def read_ahead(chunks: Iterable[T], depth: int = 32, name: str = "read-ahead") -> Iterator[T]:
    """``chunks``, produced by a second thread up to ``depth`` ahead of the caller. The engine's save
    stream comes in pieces of 256 KiB (``docker_engine.SAVE_PIECE``): 32 ahead is 8 MiB. (64 pieces
    of 1 MiB ahead measured 200-235 MiB of peak memory, against 105-113 MiB before.)"""
    handoff: Handoff[T] = Handoff(depth)

    def produce() -> None:
        try:
            for chunk in chunks:
                if not handoff.put(chunk):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            handoff.end(exc)
            return
        handoff.end()

    thread = Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        yield from handoff.items()
    finally:
        handoff.abandon()
        thread.join()


class Consumer(Generic[T, R]):
    """A function of an iterator, run in its own thread over the items the caller puts."""

    def __init__(self, consume: Callable[[Iterator[T]], R], depth: int, name: str):
        self._consume = consume
        self._handoff: Handoff[T] = Handoff(depth)
        self._result: R | None = None
        self._error: BaseException | None = None
        self._ended = False  # the end (or the abort) handed to the consumer
        self._thread = Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._consume(self._handoff.items())
        except BaseException as exc:  # raised in the caller's thread, by put() or close()
            self._error = exc
        finally:
            self._handoff.abandon()

    def put(self, item: T) -> None:
        """Hand one item to the consumer; raises at once what the consumer raised."""
        if not self._handoff.put(item) and self._error is not None:
            raise self._error

    def alive(self) -> bool:
        """The consumer still runs (it has neither ended nor failed)."""
        return self._thread.is_alive()

    def end(self) -> None:
        """End the items without waiting: the consumer finishes while the caller goes on (``close`` waits)."""
        if not self._ended:
            self._handoff.end()
            self._ended = True  # (only once handed: an interrupt inside the hand-over leaves it to abort())

    def close(self) -> R:
        """End the items, wait for the consumer; its result, or what it raised."""
        self.end()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def abort(self) -> None:
        """Stop early (the caller failed): the consumer sees the items end and is waited for, also after a
        ``close()`` an interrupt cut short in its wait (an engine's load, its stream whole, went on storing
        the image and tagged it after the clean-up had put the tag back)."""
        if not self._ended:
            self._handoff.end(HandoffAborted())
            self._ended = True
        self._thread.join()

    def __enter__(self) -> "Consumer[T, R]":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None:
            self.abort()


class Background(Generic[R]):
    """``function()`` run in a daemon :class:`Thread` (what a ``ThreadPoolExecutor`` of one worker gave):
    ``wait()`` and ``result()`` wait for it as :class:`Thread` waits (an interrupt cannot fool them), and
    the interpreter's exit never waits for it. A ``ThreadPoolExecutor``'s worker is joined at the exit:
    a run whose clean-up an interrupt had cut short waited there, signals ignored, for a load into an
    engine that never ended it (a Ctrl-C with Python's own handler there printed a traceback)."""

    def __init__(self, function: Callable[[], R], name: str):
        self._result: R | None = None
        self._error: BaseException | None = None
        self._thread = Thread(target=self._run, args=(function,), name=name, daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], R]) -> None:
        try:
            self._result = function()
        except BaseException as exc:  # raised in the caller's thread, by result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> R:
        """What ``function`` returned, once it has; or what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


def consume_in_thread(consume: Callable[[Iterator[T]], R], depth: int = 8, name: str = "consumer") \
        -> Consumer[T, R]:
    """Run ``consume(items)`` in a thread; ``put`` items, then ``close()`` for its result."""
    return Consumer(consume, depth, name)


def hashing_thread(depth: int = 32) -> Consumer[tuple, None]:
    """sha256 updates, in order, beside the reading and compressing (hashlib lets go of the GIL):
    ``put((hasher, data))``. Each item may hold a whole piece of the save stream (256 KiB)."""
    def update(items: Iterator[tuple]) -> None:
        for hasher, data in items:
            hasher.update(data)

    return Consumer(update, depth, "sha256")

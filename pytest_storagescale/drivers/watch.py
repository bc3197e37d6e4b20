"""Deadlines on the calls the engine makes to the storage outside the load itself:
the probe before a step, its set-up (:meth:`Operation.prepare`) and its clean-up.

A client library may ignore its own timeouts (davix sat in ``SSL_read`` for 11
minutes with a 10 s timeout), so a deadline passed to the driver is not enough.
:func:`run_bounded` runs such work in a daemon thread and watches every request
it sends through a :class:`RequestWatch`: when one request has been in flight for
longer than its deadline, the work is abandoned (the thread is left to the library,
as a hung load client is) and the step gets a :class:`DeadlineExceeded` error.
:func:`parallel_map` is the daemon-thread pool such work uses: the standard
library's pools join their threads at exit, which a hung request would block.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..errors import StorageError
from .base import Driver

T = TypeVar("T")

#: how often the watcher looks at the requests in flight (seconds)
WATCH_INTERVAL = 0.1


class DeadlineExceeded(StorageError):
    """A request of the engine's own (probe, set-up, clean-up) outlived its deadline."""


class RequestWatch:
    """Times every request ``driver`` sends while it runs: what :func:`run_bounded`
    watches. The driver's request methods (the ``_``-prefixed ones every driver
    implements, which its public methods and ``remove_tree`` call) are wrapped on
    the instance, so each request is timed alone however deep it is sent from."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._in_flight: dict[int, tuple[float, str, str]] = {}
        self._tickets = itertools.count().__next__
        for name in sorted(Driver.__abstractmethods__):
            setattr(driver, name, self._timed(name, getattr(driver, name)))

    def _timed(self, name: str, request: Callable[..., Any]) -> Callable[..., Any]:
        in_flight = self._in_flight

        def timed(*args: Any, **kwargs: Any) -> Any:
            ticket = self._tickets()
            in_flight[ticket] = (time.monotonic(), name.lstrip("_"), str(args[0]) if args else "")
            try:
                return request(*args, **kwargs)
            finally:
                del in_flight[ticket]

        return timed

    def oldest(self) -> tuple[float, str, str] | None:
        """(seconds in flight, request, path) of the oldest request, or None."""
        in_flight = list(self._in_flight.values())
        if not in_flight:
            return None
        began, request, path = min(in_flight)
        return time.monotonic() - began, request, path


def run_bounded(work: Callable[[], T], watch: RequestWatch, deadline: float,
                what: str) -> T:
    """``work()`` in a daemon thread; its result, or its exception raised here.

    Raises :class:`DeadlineExceeded` as soon as one request ``watch`` sees has been
    in flight for ``deadline`` seconds (the thread is abandoned). Ctrl-C reaches the
    caller at once: the wait is interruptible."""
    worker, outcome = _in_daemon_thread(work, what)
    while worker.is_alive():
        worker.join(WATCH_INTERVAL)
        oldest = watch.oldest()
        if oldest is not None and oldest[0] >= deadline and worker.is_alive():
            raise DeadlineExceeded(
                f"{what} did not finish: a request got no answer within {deadline:g} s "
                f"(the client library did not time out; the request was abandoned)",
                driver=watch.driver.name, endpoint=watch.driver.endpoint.server,
                operation=f"{what} ({oldest[1]})", path=oldest[2], error_class="deadline",
            )
    return _outcome(outcome)


def parallel_map(function: Callable[[T], Any], items: Iterable[T], parallel: int,
                 name: str) -> None:
    """``function(item)`` for every item, ``parallel`` at a time, in daemon threads
    (which never hold up the interpreter's exit); the first exception is raised
    when every thread has stopped taking items."""
    work: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        work.put(item)
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            try:
                function(item)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller
                errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"storagescale-{name}-{i}", daemon=True)
               for i in range(max(1, min(parallel, work.qsize())))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def call_with_deadline(work: Callable[[], T], deadline: float, *, what: str, driver: str,
                       endpoint: str) -> T:
    """``work()`` in a daemon thread, given up after ``deadline`` seconds of wall time
    with a :class:`DeadlineExceeded` (a single request, such as the version query,
    whose client library may not keep its own timeout)."""
    worker, outcome = _in_daemon_thread(work, what)
    worker.join(deadline)
    if worker.is_alive():
        raise DeadlineExceeded(
            f"no answer within {deadline:g} s (the request was abandoned)",
            driver=driver, endpoint=endpoint, operation=what, path="", error_class="deadline")
    return _outcome(outcome)


def _in_daemon_thread(work: Callable[[], T], what: str
                      ) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``work()`` in a daemon thread (never holding up the interpreter's exit);
    its value or exception lands in the returned dict."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            outcome["error"] = exc

    worker = threading.Thread(target=target, name=f"storagescale-{what}", daemon=True)
    worker.start()
    return worker, outcome


def _outcome(outcome: dict[str, Any]) -> Any:
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]

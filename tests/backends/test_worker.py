"""The worker process containment, driven by fake targets: no GPU, no CuPy.

Every way a kernel can end a worker (an answer, a Python exception, a crash, a hang, a sticky
error that retires the process) is played here by a plain function, so the parent-side logic
that turns them into outcomes and replaces dead workers runs on CI.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from surrotune.backends.worker import (
    Outcome,
    Retire,
    WorkerHandle,
    WorkerStartError,
)

# --------------------------------------------------------------------------- fake targets
# Module-level, because the spawn context pickles a target by reference.


def scripted(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    """Says hello with ``init``; each job is a (command, argument) pair."""

    def handle(job: tuple[str, Any]) -> Any:
        command, argument = job
        if command == "echo":
            return argument
        if command == "pid":
            return os.getpid()
        if command == "exit":
            os._exit(argument)
        if command == "signal":
            os.kill(os.getpid(), argument)
            time.sleep(60)
        if command == "hang":
            time.sleep(argument)
            return "woke up"
        if command == "raise":
            raise ValueError(argument)
        if command == "retire":
            return Retire(argument)
        raise AssertionError(f"unknown command {command!r}")

    return ("hello", init), handle


def setup_raises(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    raise RuntimeError("no GPU in this fake")


def setup_exits(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    os._exit(7)


def setup_hangs(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    time.sleep(60)
    raise AssertionError("unreachable")


@pytest.fixture
def handle() -> Iterator[WorkerHandle]:
    worker = WorkerHandle(scripted, 42, start_timeout_s=60.0, name="fake-worker")
    yield worker
    worker.close()


# --------------------------------------------------------------------------- answers


def test_reply_and_hello(handle: WorkerHandle) -> None:
    assert not handle.alive  # lazy: nothing runs before it is needed
    assert handle.hello == ("hello", 42)
    reply = handle.request(("echo", {"x": [1, 2]}), timeout_s=30)
    assert reply.outcome is Outcome.REPLY
    assert reply.value == {"x": [1, 2]}
    assert not reply.retired
    assert handle.alive


def test_requests_reuse_one_process(handle: WorkerHandle) -> None:
    first = handle.request(("pid", None), timeout_s=30).value
    second = handle.request(("pid", None), timeout_s=30).value
    assert first == second == handle.pid
    assert first != os.getpid()
    assert handle.starts == 1


def test_submit_then_receive(handle: WorkerHandle) -> None:
    handle.submit(("echo", "later"))
    with pytest.raises(RuntimeError, match="already pending"):
        handle.submit(("echo", "again"))
    assert handle.receive(timeout_s=30).value == "later"
    with pytest.raises(RuntimeError, match="no job is pending"):
        handle.receive(timeout_s=1)


# --------------------------------------------------------------------------- failures


def test_exception_is_reported_and_the_process_lives_on(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("raise", "boom"), timeout_s=30)
    assert reply.outcome is Outcome.ERROR
    assert "ValueError: boom" in reply.message
    assert handle.request(("pid", None), timeout_s=30).value == pid
    assert handle.starts == 1


def test_death_reports_the_exit_code_and_a_fresh_worker_follows(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("exit", 3), timeout_s=30)
    assert reply.outcome is Outcome.DIED
    assert reply.exit_code == 3
    assert reply.message == "worker process died (exit code 3)"
    assert not handle.alive
    after = handle.request(("pid", None), timeout_s=30)
    assert after.outcome is Outcome.REPLY
    assert after.value != pid
    assert handle.starts == 2


def test_death_by_signal_names_the_signal(handle: WorkerHandle) -> None:
    reply = handle.request(("signal", signal.SIGSEGV), timeout_s=30)
    assert reply.outcome is Outcome.DIED
    assert reply.exit_code == -signal.SIGSEGV
    assert "SIGSEGV" in reply.message
    assert handle.request(("echo", "still here"), timeout_s=30).value == "still here"


def test_hang_times_out_kills_and_restarts(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("hang", 60), timeout_s=0.5)
    assert reply.outcome is Outcome.TIMEOUT
    assert "0.5 s" in reply.message and "killed" in reply.message
    assert not handle.alive
    with pytest.raises(ProcessLookupError):  # really gone, not merely forgotten
        os.kill(pid, 0)
    after = handle.request(("pid", None), timeout_s=30)
    assert after.outcome is Outcome.REPLY and after.value != pid


def test_retire_answers_then_the_next_job_gets_a_new_process(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("retire", "sticky error"), timeout_s=30)
    assert reply.outcome is Outcome.REPLY
    assert reply.value == "sticky error"
    assert reply.retired
    assert reply.exit_code == 0
    assert handle.request(("pid", None), timeout_s=30).value != pid
    assert handle.starts == 2


# --------------------------------------------------------------------------- lifecycle


def test_restart_replaces_the_process(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    handle.restart()
    assert handle.alive and handle.pid != pid
    assert handle.request(("echo", 1), timeout_s=30).value == 1


def test_close_stops_the_process_and_is_idempotent(handle: WorkerHandle) -> None:
    handle.start()
    assert handle.alive
    handle.close()
    assert not handle.alive and handle.pid is None
    handle.close()
    # a closed handle starts again on demand
    assert handle.request(("echo", "again"), timeout_s=30).value == "again"


def test_close_kills_a_busy_worker(handle: WorkerHandle) -> None:
    handle.submit(("hang", 60))
    pid = handle.pid
    assert pid is not None
    handle.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_setup_exception_is_a_start_error() -> None:
    with (
        WorkerHandle(setup_raises, name="fake") as worker,
        pytest.raises(WorkerStartError, match="no GPU in this fake"),
    ):
        worker.start()


def test_setup_death_is_a_start_error() -> None:
    with (
        WorkerHandle(setup_exits, name="fake") as worker,
        pytest.raises(WorkerStartError, match=r"exit code 7"),
    ):
        worker.request(("echo", 1), timeout_s=30)


def test_slow_setup_is_a_start_error() -> None:
    with WorkerHandle(setup_hangs, start_timeout_s=0.5, name="fake") as worker:
        with pytest.raises(WorkerStartError, match=r"did not get ready within 0\.5 s"):
            worker.start()
        assert not worker.alive

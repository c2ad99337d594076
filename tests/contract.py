"""The error contract, checked: every public entry returns a result or raises the engine's own error.

`call(fn, *args, **kwargs)` runs one call under a deadline and returns `Outcome(result, error)`: `error` is the
`EngineError` it raised (its message names what is wrong and carries a hint), `result` what it returned. Any other
exception, a call past its deadline, or an `EngineError` without a hint fails the test with the input that caused it.

The number of hypothesis examples per test is `examples(n)`: n in the default run (CI); for the long run recorded in
docs/reliability.md, the environment variable CONTRACT_EXAMPLES gives the examples per entry family:

    CONTRACT_EXAMPLES=10000 ./run test tests/test_contract_*.py -q
"""
from __future__ import annotations

import contextlib
import os
import reprlib
import signal
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from engine.errors import EngineError

# Seconds one call may take before it counts as a hang. Generous: CI has 2 cores.
DEADLINE_S = float(os.environ.get("CONTRACT_DEADLINE_S", "20"))


def examples(default: int, share: int = 1) -> int:
    """How many hypothesis examples a contract test draws: `default` in the default run; in the long run,
    CONTRACT_EXAMPLES per entry family, split over the `share` tests that make up the family (a test parametrized
    over 8 commands draws CONTRACT_EXAMPLES / 8 for each)."""
    value = os.environ.get("CONTRACT_EXAMPLES", "").strip()
    return -(-int(value) // share) if value else default


@dataclass
class Outcome:
    result: Any = None
    error: EngineError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Hang(AssertionError):
    """A call ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float, what: str):
    """Raise Hang in the main thread when the block runs longer than `seconds` (SIGALRM; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise Hang(f"{what} ran past its deadline of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def shown(value) -> str:
    """repr(value), cut to 200 characters; a value too deep or too long to repr (nested 1,000 deep, an int of
    5,000 digits) is named by its type."""
    try:
        return reprlib.repr(value) if isinstance(value, (list, dict, tuple, set)) else repr(value)[:200]
    except (RecursionError, ValueError):
        return f"<{type(value).__name__} too deep or too long to show>"


def describe(fn: Callable, args: tuple, kwargs: dict) -> str:
    name = getattr(fn, "__qualname__", None) or shown(fn)
    parts = [shown(a) for a in args] + [f"{k}={shown(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def check_error(error: EngineError, what: str) -> None:
    """An engine error must say something and carry a hint (what to do next)."""
    text = str(error)
    if not text.strip():
        pytest.fail(f"{what} raised {type(error).__name__} with an empty message")
    if "hint" not in text.lower() and not getattr(error, "hint", None):
        pytest.fail(f"{what} raised {type(error).__name__} without a hint: {text}")


def call(fn: Callable, *args, deadline_s: float | None = None, **kwargs) -> Outcome:
    """Run fn(*args, **kwargs) under the contract: a result, or an EngineError with a hint, inside the deadline."""
    what = describe(fn, args, kwargs)
    try:
        with deadline(deadline_s or DEADLINE_S, what):
            return Outcome(result=fn(*args, **kwargs))
    except Hang as e:
        pytest.fail(str(e))
    except EngineError as e:
        check_error(e, what)
        return Outcome(error=e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 -- any other exception is the defect this module exists to find
        pytest.fail(f"{what} escaped the contract with {type(e).__name__}: {e}\n"
                    + "".join(traceback.format_exception(e)[-6:]))

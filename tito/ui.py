"""Console output shared by every `tito` command, and what Ctrl-C / SIGTERM do."""
from __future__ import annotations

import functools
import signal
import threading

import typer
from rich.console import Console
from rich.markup import escape

from .course import CourseError

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: stop at once. Every `finally` on the way out kills what it started."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum, frame):
    # Ignore further signals while the `finally` blocks clean up; one is enough.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM both raise `Interrupted` in the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _raise_interrupted)
        signal.signal(signal.SIGTERM, _raise_interrupted)


def handle_errors(fn):
    """Print a CourseError as one clear message (no traceback) and exit with code 2; an interrupt
    (Ctrl-C, SIGTERM) as one line, exit code 128 + the signal number."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        main = threading.current_thread() is threading.main_thread()
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
        install_signal_handlers()
        try:
            return fn(*args, **kwargs)
        except CourseError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)  # a command in it stays on one line
            raise typer.Exit(2)
        except KeyboardInterrupt as e:
            signum = getattr(e, "signum", signal.SIGINT)
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            err.print(f"[bold red]interrupted ({name}):[/] stopped the notebook kernel and every process tito "
                      "had started; your progress was not changed")
            raise typer.Exit(128 + signum)
        finally:
            # a command run in a process that goes on (a test's CliRunner, a notebook) gives the signals back as it
            # found them: `_raise_interrupted` leaves both ignored, and every process started later would inherit that
            # (a `tito serve` started from it then stopped on Ctrl-C with exit code 0)
            for sig, handler in before.items():
                if handler is not None:
                    signal.signal(sig, handler)

    return wrapper

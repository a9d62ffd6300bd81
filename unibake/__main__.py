"""``python -m unibake`` and the ``unibake`` command (``run``): the same command line as ``build.py``, and
as build.py does, a Ctrl-C or a SIGTERM while unibake is imported is one error line and 130, and a signal
once main() has returned leaves its exit code (SIGTERM's default would make it 143)."""

import os
import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _in_venv() -> None:
    """From a checkout with its ``.venv``, run the same command there, as build.py does (re-executing build.py
    itself, since the checkout need not be the working folder); returns only when it cannot."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv_python, build = os.path.join(root, ".venv", "bin", "python"), os.path.join(root, "build.py")
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(root, ".venv"))
    if os.path.exists(venv_python) and os.path.isfile(build) and not in_venv and not os.environ.get("UNIBAKE_REEXEC"):
        os.environ["UNIBAKE_REEXEC"] = "1"
        os.execv(venv_python, [venv_python, build, *sys.argv[1:]])


def _without(package: str) -> int:
    """A dependency is not importable: the checkout's ``.venv``, or one error line, as build.py says it (before: a
    ModuleNotFoundError traceback)."""
    _in_venv()
    if sys.stderr is not None:
        sys.stderr.write(f"error: the Python package {package!r} is not installed for {sys.executable}: run "
                         "scripts/setup.sh (it makes .venv with every pinned dependency), or pip install the "
                         "unibake package, then run it again\n")
    return 1


def _too_old() -> int:
    """A Python before 3.11 (the first python3 on PATH): the checkout's ``.venv``, or one error line."""
    _in_venv()
    if sys.stderr is not None:
        sys.stderr.write(f"error: unibake needs Python 3.11 or newer; this is {sys.version.split()[0]} "
                         f"({sys.executable}); run scripts/setup.sh, then .venv/bin/python build.py\n")
    return 1


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def run() -> int:
    if sys.version_info < (3, 11):
        return _too_old()
    for sig in _SIGNALS:  # until main() sets its own: an interrupt during the import (a second or so)
        signal.signal(sig, _interrupted)
    try:
        from .cli import main
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("error: interrupted\n")
        given = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
        if "--json" in given and sys.stdout is not None:  # the failure's document, as main() writes it
            try:
                sys.stdout.write('{\n  "error": "interrupted",\n  "exit_code": 130\n}\n')
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
        return 130
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing == __package__:
            raise
        return _without(missing)
    for sig in _SIGNALS:  # main() holds them while it runs and puts this back: a signal after it changes nothing
        signal.signal(sig, signal.SIG_IGN)
    return main()


if __name__ == "__main__":
    sys.exit(run())

"""``python -m unibake`` and the ``unibake`` command (``run``): the same command line as ``build.py``, and
as build.py does, a Ctrl-C or a SIGTERM while unibake is imported is one error line and 130, and a signal
once main() has returned leaves its exit code (SIGTERM's default would make it 143)."""

import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def run() -> int:
    for sig in _SIGNALS:  # until main() sets its own: an interrupt during the import (a second or so)
        signal.signal(sig, _interrupted)
    try:
        from .cli import main
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("error: interrupted\n")
        return 130
    for sig in _SIGNALS:  # main() holds them while it runs and puts this back: a signal after it changes nothing
        signal.signal(sig, signal.SIG_IGN)
    return main()


if __name__ == "__main__":
    sys.exit(run())

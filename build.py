#!/usr/bin/env python3
"""Entry point: ``python build.py [COMMAND] [OPTIONS]``; see ``python build.py --help`` and README.md.

Works with whatever ``python3`` is first on PATH: when the project's dependencies are not importable
it re-executes itself with the project's ``.venv`` (made by ``scripts/setup.sh``), and otherwise
says how to get them, in one ``error:`` line.
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
# every package unibake imports (the commands load them as they need them; a missing one is said here, not
# a traceback later); the reconstruct kit's verify.sh asks for the same before it runs python3
NEEDED = ("docker", "zstandard", "yaml", "jinja2", "rich", "pydantic", "unidiff", "cyclonedx", "in_toto_attestation",
          "dxf")


def _missing() -> "str | None":  # (as text: a python3 before 3.10 reaches the version check; 3.6 has no __future__ one)
    import importlib.util

    for name in NEEDED:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _in_venv() -> None:
    """Run this command again with the project's ``.venv`` (made by ``scripts/setup.sh``), when it is not the
    interpreter already; returns only when it cannot."""
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(ROOT, ".venv"))
    if os.path.exists(venv_python) and not in_venv and not os.environ.get("UNIBAKE_REEXEC"):
        os.environ["UNIBAKE_REEXEC"] = "1"
        os.execv(venv_python, [venv_python, os.path.abspath(__file__), *sys.argv[1:]])


def _ensure_environment() -> None:
    if sys.version_info < (3, 11):  # (an older python3 first on PATH: the .venv's is 3.11 or newer)
        _in_venv()
        sys.stderr.write(f"error: unibake needs Python 3.11 or newer; this is {sys.version.split()[0]} "
                         f"({sys.executable}); run scripts/setup.sh, then .venv/bin/python build.py\n")
        sys.exit(1)
    missing = _missing()
    if missing is None:
        return
    _in_venv()
    sys.stderr.write(f"error: the Python package {missing!r} is not installed for {sys.executable}: run "
                     "scripts/setup.sh (it makes .venv with every pinned dependency), then python build.py again\n")
    sys.exit(1)


if __name__ == "__main__":
    if os.path.isfile(os.path.join(ROOT, os.pardir, "kit.sha256")):
        sys.dont_write_bytecode = True  # the tool of a reconstruct kit: no file appears in the kit
    _ensure_environment()
    sys.path.insert(0, ROOT)
    import signal

    def _interrupted(signum, frame):
        raise KeyboardInterrupt

    # until main() sets its own: Ctrl-C or a SIGTERM while unibake is imported (a second or so) is one error line
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, _interrupted)
    try:
        from unibake.cli import main
    except KeyboardInterrupt:
        if sys.stderr is not None:  # (started with 2>&-: the exit code still says it)
            sys.stderr.write("error: interrupted\n")
        _given = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
        if "--json" in _given and sys.stdout is not None:  # the failure's document, as main() writes it
            try:
                sys.stdout.write('{\n  "error": "interrupted",\n  "exit_code": 130\n}\n')
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
        sys.exit(130)
    # main() holds them while it runs and puts this back: a signal once its result is out changes nothing
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, signal.SIG_IGN)

    sys.exit(main())

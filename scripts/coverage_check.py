#!/usr/bin/env python3
"""Fail unless the package is covered at 90 % and every module at 75 % (after `pytest --cov`).

    .venv/bin/python scripts/coverage_check.py [--total 90] [--module 75]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import coverage

PACKAGE = Path(__file__).resolve().parent.parent / "unibake"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=float, default=90.0)
    parser.add_argument("--module", type=float, default=75.0)
    args = parser.parse_args()
    cov = coverage.Coverage(config_file=".coveragerc")
    cov.load()
    data = cov.get_data()
    if not data.measured_files():
        print("error: no coverage data: run the tests first (make test)", file=sys.stderr)
        return 1
    total = cov.report(file=open("/dev/null", "w"))
    low = []
    for path in sorted(PACKAGE.glob("*.py")):  # every module, measured or never imported
        _, statements, _, missing, _ = cov.analysis2(str(path))
        if statements:
            percent = 100.0 * (len(statements) - len(missing)) / len(statements)
            if percent < args.module:
                low.append(f"{path.name} {percent:.1f} %")
    print(f"coverage: {total:.1f} % of the package's lines (unit and engine tests together)")
    failed = False
    if total < args.total:
        print(f"error: coverage {total:.1f} % is below {args.total:.0f} %", file=sys.stderr)
        failed = True
    if low:
        print(f"error: modules below {args.module:.0f} %: {', '.join(low)}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

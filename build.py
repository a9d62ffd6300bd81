#!/usr/bin/env python3
"""Entry point: python build.py [--profile NAME ...] [--stage render|build] | lock. See README.md."""

import sys

from unibake.cli import main

if __name__ == "__main__":
    sys.exit(main())

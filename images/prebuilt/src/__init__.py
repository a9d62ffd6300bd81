"""demo_quant: a prebuilt kernel shipped as a wheel; the library sits next to this file."""

import os

LIBRARY = os.path.join(os.path.dirname(__file__), "libdemo_quant.so")

"""lmslim: prebuilt quantisation kernels; the library sits next to this file."""

"""Only the C extensions are declared here; everything else is in pyproject.toml.

The chunker kernel and the background I/O thread (``gitxet.util._bgio``) are optional for
local installs (the fallbacks: the pure-Python chunker, that I/O on the calling thread)
but mandatory when GITXET_REQUIRE_NATIVE=1, so CI and release builds can never ship
silently without them.
"""

import os

from setuptools import Extension, setup

required = os.environ.get("GITXET_REQUIRE_NATIVE") == "1"

setup(
    ext_modules=[
        Extension(
            "gitxet.chunking._cdc",
            ["gitxet/chunking/_cdc.c"],
            extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wconversion", "-Wsign-compare"],
            optional=not required,
        ),
        Extension(
            "gitxet.util._bgio",
            ["gitxet/util/_bgio.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wconversion", "-Wsign-compare"],
            optional=not required,
        ),
    ]
)

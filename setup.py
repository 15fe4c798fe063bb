"""Only the C extension is declared here; everything else is in pyproject.toml.

The chunker kernel is optional for local installs (the pure-Python reference is the
fallback) but mandatory when GITXET_REQUIRE_NATIVE=1, so CI and release builds can never
ship silently without it.
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
        )
    ]
)

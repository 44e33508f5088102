"""The compiled event scanner (diagnostics/trace/event_scan.c), built in place by
scripts/setup.sh. Optional: where no C compiler is found, the trace loader reads every
chunk with msgspec, as it does any chunk the scanner declines."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "diagnostics.trace._event_scan",
            ["diagnostics/trace/event_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)

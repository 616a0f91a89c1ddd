"""Build of fastrl_ext's native modules; everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fastrl_ext._rings",
            sources=["fastrl_ext/src/rings.cpp"],
            language="c++",
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden"],
        ),
        Extension(
            "fastrl_ext._vtrace",
            sources=["fastrl_ext/src/vtrace.cpp"],
            language="c++",
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden"],
        ),
    ],
)

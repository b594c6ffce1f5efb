"""Builds the C++ shim (torchtpu._C) against the installed torch at install time."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            "torchtpu._C",
            ["src/torchtpu/csrc/shim.cpp"],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)

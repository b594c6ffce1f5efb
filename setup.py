"""Builds the native parts at install time.

* ``torchtpu._C``: the C++ shim against the installed torch (PyPI's CPU wheel).
* ``torchtpu._profiler``: torch.profiler's device rows (a Kineto activity profiler for
  PrivateUse1), built apart from ``_C`` as it needs Kineto's headers and ``USE_KINETO``.
* ``torchtpu._cpu_kernels``: host-CPU kernels that XLA:CPU programs call as custom
  calls (no torch, no Python API: the runtime loads it with ctypes). x86-64 only.
"""

import os
import platform

from setuptools import Extension, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

# TORCHTPU_SANITIZE=1 (make test-asan): AddressSanitizer and UndefinedBehaviorSanitizer builds,
# loaded into an unsanitized Python with the sanitizer runtimes preloaded.
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"] if os.environ.get("TORCHTPU_SANITIZE") else []

ext_modules = [
    CppExtension(
        "torchtpu._C",
        ["src/torchtpu/csrc/shim.cpp", "src/torchtpu/csrc/collect.cpp",
         "src/torchtpu/csrc/record.cpp", "src/torchtpu/csrc/op_key.cpp", "src/torchtpu/csrc/defer.cpp",
         "src/torchtpu/csrc/precision_tls.cpp", "src/torchtpu/csrc/kernel_front.cpp"],
        extra_compile_args=["-O2", "-std=c++17", *SANITIZE],
        extra_link_args=SANITIZE,
    ),
    CppExtension(
        "torchtpu._profiler",
        ["src/torchtpu/csrc/profiler.cpp"],
        include_dirs=[os.path.join(p, "kineto") for p in include_paths() if p.endswith("include")],
        define_macros=[("USE_KINETO", None)],
        extra_compile_args=["-O2", "-std=c++17", *SANITIZE],
        extra_link_args=SANITIZE,
    ),
]
if platform.machine() in ("x86_64", "AMD64"):
    ext_modules.append(
        Extension(
            "torchtpu._cpu_kernels",
            ["src/torchtpu/csrc/cpu_kernels.cpp", "src/torchtpu/csrc/cpu_linalg.cpp"],
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden", *SANITIZE],
            extra_link_args=SANITIZE,
            language="c++",
            # A compiler without the AVX-512 BF16 intrinsics skips it: XLA then transposes.
            optional=True,
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExtension})

"""Builds the Python package qkv for `pip install --no-build-isolation .` (pyproject.toml): the pure
Python files of python/qkv, and the extension module qkv._qkv built by CMake from this tree (static
libraries, no tests, tools or examples) for the interpreter that runs pip. A CMake build of the
whole project builds the same module (python/CMakeLists.txt); this only drives it."""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    text = open(os.path.join(ROOT, "include", "qkv", "version.hpp"), encoding="utf-8").read()
    return ".".join(re.search(r"#define QKV_VERSION_%s (\d+)" % part, text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     "-DPython_EXECUTABLE=" + sys.executable, "-DQKV_BUILD_PYTHON=ON", "-DQKV_BUILD_TESTS=OFF",
                     "-DQKV_BUILD_TOOLS=OFF", "-DQKV_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        subprocess.check_call(configure)
        jobs = os.environ.get("QKV_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build, "--target", "qkv_python", "-j", jobs])
        built = glob.glob(os.path.join(build, "python", "qkv", "_qkv*"))
        if len(built) != 1:
            raise RuntimeError("the CMake build made no extension module qkv._qkv (python/CMakeLists.txt): %s" % built)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    version=version(),
    packages=["qkv"],
    package_dir={"qkv": "python/qkv"},
    package_data={"qkv": ["*.pyi", "py.typed"]},
    ext_modules=[CMakeExtension("qkv._qkv")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)

"""The compiled scan for changed elements (varsync/_scan.c); the rest of the build is in
pyproject.toml.

The extension is optional: where no C compiler is, the install goes on and varsync scans
with numpy, to the same positions at about half the speed (``varsync._elements.SCANNER``
says which). It uses the buffer protocol only, so one build serves numpy 1 and 2.

An editable install copies the built module into the source tree, and setuptools copies
it over the one there in place. `make test` installs varsync editable into four
environments side by side, three on the same Python, and a test process of one may have
the module mapped while another environment's install rewrites it: a mapped file
truncated under a process is a SIGBUS. So the copy goes to a temporary file that then
replaces the module (a rename): a process keeps the file it mapped."""

from __future__ import annotations

import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class ReplacingBuildExt(build_ext):
    def copy_file(self, infile, outfile, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not (getattr(self, "editable_mode", False) or self.inplace):
            return super().copy_file(infile, outfile, *args, **kwargs)
        if os.path.isdir(outfile):
            outfile = os.path.join(outfile, os.path.basename(infile))
        temporary = f"{outfile}.{os.getpid()}.tmp"
        shutil.copyfile(infile, temporary)
        shutil.copymode(infile, temporary)
        os.replace(temporary, outfile)
        return outfile, True


setup(
    ext_modules=[Extension("varsync._scan", ["varsync/_scan.c"], optional=True)],
    cmdclass={"build_ext": ReplacingBuildExt},
)

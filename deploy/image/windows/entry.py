"""PyInstaller's entry point for gpumon.exe (deploy/image/windows/build.ps1): the ``gpumon``
console script, which a frozen program cannot take from the package's metadata."""

import sys

from gpumon.cli import main

if __name__ == "__main__":
    sys.exit(main())

# Freezes gpumon into dist\gpumon\gpumon.exe with PyInstaller, on Windows (PyInstaller builds
# for the OS it runs on). Run from anywhere in the checkout:
#   powershell -ExecutionPolicy Bypass -File deploy\image\windows\build.ps1 [-Version 0.1.0] [-Revision <git sha>]
# Then build the image from dist\ (deploy\image\windows\Containerfile). docs/images.md.
param(
  [string]$Version = "",
  [string]$Revision = ""
)
$ErrorActionPreference = "Stop"
$Root = (Resolve-Path "$PSScriptRoot\..\..\..").Path
Set-Location $Root
if (-not $Version) {
  $Version = (Select-String -Path gpumon\__init__.py -Pattern '^__version__ = "(.*)"').Matches[0].Groups[1].Value
}
if (-not $Revision) { $Revision = (git rev-parse HEAD).Trim() }

# A clean venv of its own: only gpumon's runtime dependencies go into the frozen program.
python -m venv .build-windows
& .build-windows\Scripts\python -m pip install --quiet . "pyinstaller>=6.10,<7"
if ($LASTEXITCODE -ne 0) { throw "pip install failed" }

# What `gpumon version` reports (gpumon/runtime/build.py), as deploy/image/Containerfile bakes it on Linux.
# WriteAllText: UTF-8 without a byte-order mark, which Windows PowerShell's Set-Content would add.
$BuildDir = New-Item -ItemType Directory -Force (Join-Path $env:TEMP "gpumon-build")
$Build = Join-Path $BuildDir "build.json"
[IO.File]::WriteAllText($Build, (@{ version = $Version; revision = $Revision } | ConvertTo-Json -Compress))

# The commands are imported by name (gpumon/cli.py), and the package's YAML and proto files are
# read at run time: PyInstaller's import scan sees neither, so both are collected explicitly.
& .build-windows\Scripts\pyinstaller --noconfirm --clean --console --name gpumon `
  --distpath dist --workpath build\pyinstaller `
  --collect-submodules gpumon --collect-data gpumon `
  --collect-submodules pynvml `
  --add-data "$Build;gpumon" `
  deploy\image\windows\entry.py
if ($LASTEXITCODE -ne 0) { throw "pyinstaller failed" }
& dist\gpumon\gpumon.exe version
if ($LASTEXITCODE -ne 0) { throw "the frozen gpumon.exe does not start" }

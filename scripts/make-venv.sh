#!/usr/bin/env bash
# A virtual environment with pip, made by run.sh's set-up:
#
#   scripts/make-venv.sh PYTHON VENV [STAGE_DIR]
#
# Where PYTHON's venv module cannot install pip (no ensurepip, as on Debian/Ubuntu without python3-venv), the venv is
# made --without-pip and pip comes from the stage's pip wheel (STAGE_DIR/pip/pip-*.whl, scripts/stage-device.py), else
# from PYTHON's own pip; one line says which. Without a venv module, or without any pip: one line saying what works,
# exit 2.
set -euo pipefail
base=${1:?usage: scripts/make-venv.sh PYTHON VENV [STAGE_DIR]}
venv=${2:?usage: scripts/make-venv.sh PYTHON VENV [STAGE_DIR]}
stage=${3:-}
echo "setup: creating $venv with $("$base" --version 2>&1)"
err=$("$base" -m venv "$venv" 2>&1) && exit 0
rm -rf "$venv"
if ! "$base" -c 'import venv' 2>/dev/null; then
  echo "error: $("$base" --version 2>&1) ($(command -v "$base")) has no venv module: install it (Debian/Ubuntu: apt install python3-venv), or point PYTHON= at a Python that has it" >&2
  exit 2
fi
"$base" -m venv --without-pip "$venv" || { echo "error: $base -m venv --without-pip $venv failed" >&2; exit 2; }
why=$(printf '%s\n' "$err" | grep -v '^[[:space:]]*$' | head -1 | cut -c1-160)
wheel=$(ls "${stage:-/nonexistent}"/pip/pip-*.whl 2>/dev/null | tail -1 || true)
if [ -n "$wheel" ]; then
  echo "setup: $base cannot install pip into a venv ($why): made $venv --without-pip, pip from the staged $(basename "$wheel")"
  "$venv/bin/python" "$wheel/pip" install -q --no-index --disable-pip-version-check "$wheel"
elif "$base" -m pip --version >/dev/null 2>&1; then
  echo "setup: $base cannot install pip into a venv ($why): made $venv --without-pip, pip installed by $base's own pip"
  "$base" -m pip --python "$venv/bin/python" install -q --disable-pip-version-check pip
else
  rm -rf "$venv"
  echo "error: $base cannot install pip into a venv ($why) and has no pip of its own: install python3-venv (Debian/Ubuntu), or stage with scripts/stage-device.py (it carries a pip wheel) and pass --offline DIR" >&2
  exit 2
fi

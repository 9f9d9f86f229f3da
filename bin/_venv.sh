# Sourced by bin/test and bin/serve: `ensure_venv REQUIREMENTS_FILE`.
# Creates .venv when missing (or broken: moved, its Python gone) with $PYTHON (default
# python3, 3.11 or later) and installs REQUIREMENTS_FILE plus this package (editable),
# skipping the install while a stamp of the inputs' hash matches. A lock keeps
# concurrent runs from installing into the same venv at once.

ensure_venv() {
  local requirements=$1 venv=.venv stamp want python=${PYTHON:-python3}
  stamp="$venv/.stamp-$(basename "$requirements" .txt)"
  want=$(cat requirements/*.txt pyproject.toml | sha256sum | cut -d' ' -f1)
  mkdir -p "$venv"
  exec 9>"$venv/.install.lock"
  flock 9
  if [ -e "$venv/bin/python" ] && ! "$venv/bin/python" -c '' 2>/dev/null; then
    echo "bin: $venv is broken (moved, or its Python is gone): making it again" >&2
    find "$venv" -mindepth 1 -maxdepth 1 ! -name .install.lock -exec rm -rf {} +
  fi
  if [ ! -x "$venv/bin/python" ]; then
    if ! command -v "$python" >/dev/null 2>&1; then
      echo "bin: no $python here: install Python 3.11 or later, or set PYTHON=/path/to/python3" >&2
      return 1
    fi
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "bin: $python is Python $("$python" -c 'import platform; print(platform.python_version())'); 3.11 or later is needed (set PYTHON=...)" >&2
      return 1
    fi
    echo "bin: creating $venv with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')" >&2
    if ! "$python" -m venv "$venv"; then
      find "$venv" -mindepth 1 -maxdepth 1 ! -name .install.lock -exec rm -rf {} +
      echo "bin: '$python -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
      return 1
    fi
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bin: installing $requirements and aaa_django (editable) into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" -e .
    echo "$want" >"$stamp"
  fi
  flock -u 9
  exec 9>&-
}

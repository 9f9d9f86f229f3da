# Sourced by bin/test and bin/serve: `ensure_venv REQUIREMENTS_FILE`.
# Creates .venv with python3 when missing and installs REQUIREMENTS_FILE plus this
# package (editable), skipping the install while a stamp of the inputs' hash matches.
# A lock keeps concurrent runs from installing into the same venv at once.

ensure_venv() {
  local requirements=$1 venv=.venv stamp want
  stamp="$venv/.stamp-$(basename "$requirements" .txt)"
  want=$(cat requirements/*.txt pyproject.toml | sha256sum | cut -d' ' -f1)
  mkdir -p "$venv"
  exec 9>"$venv/.install.lock"
  flock 9
  if [ ! -x "$venv/bin/python" ]; then
    echo "bin: creating $venv" >&2
    python3 -m venv "$venv"
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bin: installing $requirements and aaa_django (editable) into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" -e .
    echo "$want" >"$stamp"
  fi
  flock -u 9
  exec 9>&-
}

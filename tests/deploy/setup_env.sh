#!/usr/bin/env bash
# Prepares the tools of the deploy validation (tests/deploy/validate.sh): a
# venv at VENV that sees the system site-packages (Debian's python3-yaml) and
# gets kubernetes-validate (Kubernetes API JSON schemas, with jsonschema),
# yamllint and PyYAML from PyPI. Without network the venv still works and
# validate.sh skips what is missing, saying so; only a missing PyYAML fails.
# usage: setup_env.sh PYTHON VENV
set -uo pipefail
python=$1 venv=$2

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv --system-site-packages "$venv" || {
    echo "setup_env: '$python -m venv' failed: install python3-venv" >&2; exit 1; }
fi
py=$venv/bin/python
need=()
"$py" -c "import yaml" 2>/dev/null || need+=(pyyaml)
"$py" -c "import kubernetes_validate, jsonschema" 2>/dev/null || need+=(kubernetes-validate)
"$py" -c "import yamllint" 2>/dev/null || need+=(yamllint)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup_env: pip install ${need[*]}"
  "$py" -m pip install --disable-pip-version-check -q "${need[@]}" \
    || echo "setup_env: WARNING: pip install ${need[*]} failed; validate.sh will skip those validators"
fi
"$py" -c "import yaml" || { echo "setup_env: PyYAML missing: apt-get install python3-yaml" >&2; exit 1; }
exit 0

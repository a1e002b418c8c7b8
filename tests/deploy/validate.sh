#!/usr/bin/env bash
# Offline validation of fusedserve's deployment assets (the ctest test
# deploy_validate): Kubernetes manifests (kustomize render, API schemas,
# cross-object checks), Prometheus rules (promtool check + unit tests),
# dashboard and adapter queries (promtool), YAML style (yamllint), the
# Dockerfile, and the build scripts. Tools that are not installed are skipped
# with a message; tests/deploy/check_manifests.py always runs.
# usage: validate.sh [PYTHON]   (default python3; ctest passes its venv's)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${1:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()

step() {  # step NAME COMMAND...
  local name=$1; shift
  echo "=== $name"
  if "$@"; then echo "=== $name: ok"; else echo "=== $name: FAILED"; failed+=("$name"); fi
}
skip() { echo "=== $1: SKIPPED ($2)"; }

step "manifests, schemas, cross-checks, dashboard, Dockerfile" \
  "$py" "$root/tests/deploy/check_manifests.py" --root "$root" --promql-out "$tmp/queries.yaml"

if command -v promtool >/dev/null; then
  step "promtool check rules alerts.yaml" promtool check rules "$root/deploy/prometheus/alerts.yaml"
  step "promtool test rules alerts_test.yaml" promtool test rules "$root/deploy/prometheus/alerts_test.yaml"
  if [ -f "$tmp/queries.yaml" ]; then
    step "promtool parses the dashboard and adapter queries" promtool check rules "$tmp/queries.yaml"
  fi
  # The generated PrometheusRule's spec is a rules file too.
  if "$py" -c "import yaml,sys; d=yaml.safe_load(open(sys.argv[1])); yaml.safe_dump(d['spec'], open(sys.argv[2],'w'))" \
      "$root/deploy/k8s/base/prometheusrule.yaml" "$tmp/prometheusrule-spec.yaml" 2>/dev/null; then
    step "promtool check rules (PrometheusRule spec)" promtool check rules "$tmp/prometheusrule-spec.yaml"
  else
    skip "promtool check rules (PrometheusRule spec)" "PyYAML missing for $py"
  fi
else
  skip "promtool" "not installed (Debian: apt-get install prometheus)"
fi

if "$py" -c "import yamllint" 2>/dev/null; then
  step "yamllint deploy/" "$py" -m yamllint -s -c "$root/tests/deploy/yamllint.yaml" "$root/deploy"
elif command -v yamllint >/dev/null; then
  step "yamllint deploy/" yamllint -s -c "$root/tests/deploy/yamllint.yaml" "$root/deploy"
else
  skip "yamllint" "not installed (pip install yamllint, or apt-get install yamllint)"
fi

check_scripts() {
  local ok=0 s
  for s in "$root"/deploy/*.sh "$root"/clients/python/generate_stubs.sh "$root"/tests/python/setup_env.sh "$root"/tests/deploy/*.sh; do
    [ -x "$s" ] || { echo "not executable: $s"; ok=1; }
    bash -n "$s" || ok=1
  done
  return $ok
}
step "shell scripts parse and are executable" check_scripts
if command -v shellcheck >/dev/null; then
  step "shellcheck" shellcheck -S warning "$root"/deploy/*.sh "$root"/clients/python/generate_stubs.sh "$root"/tests/python/setup_env.sh "$root"/tests/deploy/*.sh
else
  skip "shellcheck" "not installed (apt-get install shellcheck)"
fi

image_cmd() {
  local out
  out=$(DRY_RUN=1 "$root/deploy/build-image.sh" fusedserve:test) || return 1
  echo "$out"
  grep -q -- "-f Dockerfile" <<<"$out" && grep -q "REVISION=" <<<"$out"
}
step "build-image.sh composes the image build (dry run)" image_cmd
runtime_list() { "$root/deploy/install-runtime-deps.sh" --print; }
if [ -r /etc/os-release ] && "$root/deploy/install-runtime-deps.sh" --print >/dev/null 2>&1; then
  step "install-runtime-deps.sh has a package list for this distribution" runtime_list
  if command -v apt-cache >/dev/null && apt-cache show libc6 >/dev/null 2>&1; then
    known() { local p ok=0; for p in $(runtime_list); do apt-cache show "$p" >/dev/null 2>&1 || { echo "unknown package: $p"; ok=1; }; done; return $ok; }
    step "runtime packages exist in this distribution's archive" known
  else
    skip "runtime package names" "no apt package lists here (apt-get update)"
  fi
else
  skip "install-runtime-deps.sh list" "no list for this distribution"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "deploy validation FAILED: ${failed[*]}"
  exit 1
fi
echo "deploy validation passed"

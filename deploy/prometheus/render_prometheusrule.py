#!/usr/bin/env python3
"""Writes deploy/k8s/base/prometheusrule.yaml (a Prometheus Operator PrometheusRule)
from deploy/prometheus/alerts.yaml, the plain rules file promtool checks, so the
two never drift. Text-based: the rule groups (and their comments) are copied
under spec: as they are.

usage: render_prometheusrule.py [--check]
  --check  exit 1 when the committed prometheusrule.yaml differs from the render
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "alerts.yaml"
TARGET = HERE.parent / "k8s" / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yaml by
# deploy/prometheus/render_prometheusrule.py: edit alerts.yaml and re-run it.
# The Prometheus Operator selects rules by label: add your Prometheus's
# ruleSelector labels in an overlay (the example adds release: kube-prometheus-stack).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: fusedserve
  labels:
    app.kubernetes.io/name: fusedserve
    app.kubernetes.io/component: alerting
spec:
"""


def render() -> str:
    lines = SOURCE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{TARGET.name} matches {SOURCE.name}")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

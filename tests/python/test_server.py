"""Health, GetServerInfo, /metrics and shutdown of the real server, through the Python client."""

import re
import time

import numpy as np
import pytest

from conftest import SOURCE_DIR, ServerProcess
from fusedserve_client import FusedServeClient, pb

# The op table of the README: every op must be listed by GetServerInfo.
DESIGN_OPS = {
    "rms_norm": (["x", "weight"], ["y"]),
    "add_rms_norm": (["x", "residual", "weight"], ["y", "residual_out"]),
    "add_rms_norm_silu": (["x", "residual", "weight"], ["y"]),
    "layer_norm": (["x", "weight", "bias"], ["y"]),
    "softmax": (["x"], ["y"]),
    "silu_and_mul": (["x"], ["y"]),
    "gelu": (["x"], ["y"]),
    "rope": (["q", "k", "positions"], ["q_out", "k_out"]),
    "linear": (["x", "weight"], ["y"]),
    "swiglu_mlp": (["x", "gate_up", "down"], ["y"]),
    "attention": (["q", "k", "v", "seq_lens"], ["o"]),
    "attention_decode": (["q", "k_cache", "v_cache", "lengths"], ["o"]),
}


def test_health_is_serving(client):
    assert client.health() == "SERVING"


def test_server_info(client, server):
    info = client.server_info()
    assert info.version
    assert info.device == "cpu"
    assert info.device_name
    ops = {op.name: op for op in info.ops}
    missing = sorted(set(DESIGN_OPS) - set(ops))
    assert not missing, f"ops missing from GetServerInfo: {missing}"
    for name, (inputs, outputs) in DESIGN_OPS.items():
        assert set(inputs) <= set(ops[name].inputs), (name, list(ops[name].inputs))
        assert list(ops[name].outputs) == outputs, (name, list(ops[name].outputs))
        assert pb.F32 in ops[name].dtypes, name
    assert info.tuning_cache.state


def test_server_info_model(client):
    m = client.server_info().model
    if m.hidden_size == 0:
        pytest.skip("this build hosts no model yet (ModelInfo is empty)")
    assert m.name
    assert m.num_layers > 0 and m.vocab_size > 0 and m.head_dim > 0
    assert m.num_kv_heads > 0 and m.num_q_heads % m.num_kv_heads == 0


def _families(text):
    """name -> type from the '# TYPE' lines of a Prometheus text exposition."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def _documented_metrics():
    """name -> type from the tables of docs/metrics.md."""
    doc = (SOURCE_DIR / "docs" / "metrics.md").read_text()
    return dict(re.findall(r"^\| `(fusedserve_\w+)` \| (\w+) \|", doc, flags=re.M))


def _sample(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = re.match(r"^(\w+)(\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(4))
            found = True
    return total if found else None


def test_metrics_count_requests(client, server):
    before = _sample(server.scrape(), "fusedserve_requests_total", op="rms_norm", code="OK") or 0.0
    x, w = np.ones((2, 8), np.float32), np.ones(8, np.float32)
    for _ in range(3):
        client.fused_op("rms_norm", x=x, weight=w)
    # A call's metric updates land just after its answer is written.
    deadline = time.monotonic() + 10
    while True:
        text = server.scrape()
        after = _sample(text, "fusedserve_requests_total", op="rms_norm", code="OK")
        timed = _sample(text, "fusedserve_request_duration_seconds_count", op="rms_norm") or 0.0
        if (after is not None and after - before >= 3 and timed >= 3) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "fusedserve_requests_total" in text
    assert after is not None, "no fusedserve_requests_total sample with op=\"rms_norm\",code=\"OK\":\n" + \
        "\n".join(l for l in text.splitlines() if l.startswith("fusedserve_requests_total"))
    assert after - before >= 3
    assert _sample(text, "fusedserve_request_duration_seconds_count", op="rms_norm") >= 3


def test_ready_gauge_is_one_when_serving(server):
    value = _sample(server.scrape(), "fusedserve_ready")
    if value is None:
        pytest.skip("fusedserve_ready is not exported by this build")
    assert value == 1.0


def test_every_exported_metric_is_documented(client, server):
    client.fused_op("softmax", x=np.ones((1, 4), np.float32))
    exported = {n: t for n, t in _families(server.scrape()).items() if n.startswith("fusedserve_")}
    documented = _documented_metrics()
    assert exported, "no fusedserve_* metric families exported"
    undocumented = sorted(set(exported) - set(documented))
    assert not undocumented, f"exported but not in docs/metrics.md: {undocumented}"
    wrong_type = {n: (t, documented[n]) for n, t in exported.items() if documented[n] != t}
    assert not wrong_type, f"type exported vs documented: {wrong_type}"


def test_sigterm_exits_zero(server_bin, tmp_path):
    proc = ServerProcess(server_bin, tmp_path).start()
    try:
        with FusedServeClient(proc.target) as c:
            c.fused_op("rms_norm", x=np.ones((1, 4), np.float32), weight=np.ones(4, np.float32))
        code = proc.terminate(timeout=60)
    finally:
        proc.stop()
    assert code == 0, f"exit code {code} after SIGTERM:\n{proc.log_tail()}"

"""FusedOp over real gRPC on the CPU backend, checked against float64 numpy references."""

import threading

import numpy as np
import pytest
import grpc

from fusedserve_client import FusedServeError

import _reference as ref

RNG = np.random.default_rng(20261121)

# Tolerances per wire dtype: the server accumulates in fp32 and rounds the
# output to the wire dtype once.
TOL = {"f32": dict(rtol=1e-5, atol=1e-5), "f16": dict(rtol=2e-3, atol=2e-3), "bf16": dict(rtol=1.6e-2, atol=1.6e-2)}


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def rounded(a, dtype):
    """The input as the server sees it after conversion to the wire dtype."""
    from fusedserve_client import bf16_bits_to_float, float_to_bf16_bits
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return bf16_bits_to_float(float_to_bf16_bits(a)).astype(np.float64)
    return a.astype(np.float64)


@pytest.mark.parametrize("rows,hidden", [(1, 1), (3, 7), (17, 769), (2, 4096)])
def test_rms_norm_f32(client, rows, hidden):
    x, w = rand(rows, hidden), rand(hidden)
    out = client.fused_op("rms_norm", x=x, weight=w, eps=1e-6)
    assert set(out) == {"y"}
    assert out["y"].dtype == np.float32 and out["y"].shape == (rows, hidden)
    np.testing.assert_allclose(out["y"], ref.rms_norm(x, w, 1e-6), **TOL["f32"])


def test_rms_norm_default_eps_and_leading_dims(client):
    x, w = rand(2, 3, 64, scale=1e-3), rand(64)  # small values make eps matter
    out = client.fused_op("rms_norm", x=x, weight=w)["y"]
    assert out.shape == (2, 3, 64)
    np.testing.assert_allclose(out, ref.rms_norm(x, w, 1e-5), **TOL["f32"])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_rms_norm_half_dtypes(client, dtype):
    x, w = rand(5, 257), rand(257)
    out = client.fused_op("rms_norm", x=x, weight=w, eps=1e-5, dtype=dtype)["y"]
    assert out.dtype == (np.float16 if dtype == "f16" else np.float32)
    expected = ref.rms_norm(rounded(x, dtype), rounded(w, dtype), 1e-5)
    np.testing.assert_allclose(out.astype(np.float64), expected, **TOL[dtype])


def test_float16_arrays_keep_their_dtype(client):
    x, w = rand(4, 32).astype(np.float16), rand(32).astype(np.float16)
    out = client.fused_op("rms_norm", x=x, weight=w)["y"]
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref.rms_norm(x, w), **TOL["f16"])


def test_add_rms_norm(client):
    x, r, w = rand(6, 96), rand(6, 96), rand(96)
    out = client.fused_op("add_rms_norm", x=x, residual=r, weight=w, eps=1e-5)
    assert set(out) == {"y", "residual_out"}
    np.testing.assert_allclose(out["residual_out"], x.astype(np.float64) + r, **TOL["f32"])
    np.testing.assert_allclose(out["y"], ref.rms_norm(x.astype(np.float64) + r, w), **TOL["f32"])


def test_layer_norm(client):
    x, w, b = rand(3, 130), rand(130), rand(130)
    out = client.fused_op("layer_norm", x=x, weight=w, bias=b, eps=1e-5)["y"]
    np.testing.assert_allclose(out, ref.layer_norm(x, w, b), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("rows,cols,scale", [(1, 1, 1.0), (5, 1000, 1.0), (3, 33, 100.0)])
def test_softmax(client, rows, cols, scale):
    x = rand(rows, cols, scale=scale)
    y = client.fused_op("softmax", x=x)["y"]
    np.testing.assert_allclose(y, ref.softmax(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("activation", ["none", "silu", "gelu", "gelu_tanh"])
def test_linear_with_bias(client, activation):
    m, k, n = 7, 65, 33
    x, w, b = rand(m, k), rand(n, k, scale=k ** -0.5), rand(n)
    y = client.fused_op("linear", x=x, weight=w, bias=b, activation=activation)["y"]
    assert y.shape == (m, n)
    np.testing.assert_allclose(y, ref.linear(x, w, b, activation), rtol=1e-4, atol=1e-4)


def test_linear_without_bias_default_activation(client):
    x, w = rand(4, 128), rand(16, 128, scale=128 ** -0.5)
    y = client.fused_op("linear", inputs={"x": x, "weight": w})["y"]
    np.testing.assert_allclose(y, ref.linear(x, w), rtol=1e-4, atol=1e-4)


def test_silu_and_mul(client):
    x = rand(9, 2 * 48)
    y = client.fused_op("silu_and_mul", x=x)["y"]
    assert y.shape == (9, 48)
    np.testing.assert_allclose(y, ref.silu_and_mul(x), rtol=1e-5, atol=1e-6)


def test_missing_input_is_invalid_argument_naming_it(client):
    with pytest.raises(FusedServeError) as e:
        client.fused_op("rms_norm", x=rand(2, 8))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "weight" in e.value.details


def test_shape_mismatch_is_invalid_argument(client):
    with pytest.raises(FusedServeError) as e:
        client.fused_op("rms_norm", x=rand(2, 8), weight=rand(9))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "weight" in e.value.details


def test_unknown_op_is_invalid_argument(client):
    with pytest.raises(FusedServeError) as e:
        client.fused_op("no_such_op", x=rand(2, 2))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "no_such_op" in e.value.details


def test_server_answers_after_bad_requests(client):
    x, w = rand(2, 16), rand(16)
    np.testing.assert_allclose(client.fused_op("rms_norm", x=x, weight=w)["y"], ref.rms_norm(x, w), **TOL["f32"])


def test_concurrent_callers_each_get_their_own_rows(client):
    w = rand(256)
    inputs = [rand(1 + i % 4, 256) for i in range(32)]
    results = [None] * len(inputs)
    errors = []

    def call(i):
        try:
            results[i] = client.fused_op("rms_norm", x=inputs[i], weight=w)["y"]
        except Exception as e:  # reported below, with its index
            errors.append((i, e))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for x, y in zip(inputs, results):
        np.testing.assert_allclose(y, ref.rms_norm(x, w), **TOL["f32"])

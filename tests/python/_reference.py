"""float64 numpy references of the ops the tests call (the formulas of the README's op table)."""

import math

import numpy as np


def rms_norm(x, weight, eps=1e-5):
    x = np.asarray(x, np.float64)
    rows = x.reshape(-1, x.shape[-1])
    inv = 1.0 / np.sqrt(np.mean(rows * rows, axis=-1, keepdims=True) + eps)
    return (rows * inv * np.asarray(weight, np.float64)).reshape(x.shape)


def layer_norm(x, weight, bias, eps=1e-5):
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def silu(x):
    x = np.asarray(x, np.float64)
    return x / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x, approximate="none"):
    x = np.asarray(x, np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def linear(x, weight, bias=None, activation="none"):
    y = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return {"none": lambda v: v, "silu": silu, "gelu": gelu,
            "gelu_tanh": lambda v: gelu(v, "tanh")}[activation](y)


def silu_and_mul(x):
    x = np.asarray(x, np.float64)
    i = x.shape[-1] // 2
    return silu(x[..., :i]) * x[..., i:]

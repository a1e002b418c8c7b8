"""TransformerBlock through the Python client (skips while the build hosts no model)."""

import grpc
import numpy as np
import pytest

from fusedserve_client import FusedServeError


def _model_or_skip(client):
    m = client.server_info().model
    if m.hidden_size == 0 or m.num_layers == 0:
        pytest.skip("this build hosts no model")
    return m


def _block_or_skip(client, hidden, **kw):
    try:
        return client.transformer_block(hidden, **kw)
    except FusedServeError as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            pytest.skip(f"TransformerBlock is UNIMPLEMENTED: {e.details}")
        raise


def test_layers_compose(client):
    m = _model_or_skip(client)
    h = np.random.default_rng(1).standard_normal((2, 5, m.hidden_size)).astype(np.float32)
    full = _block_or_skip(client, h)
    assert full.shape == h.shape and full.dtype == np.float32
    assert np.isfinite(full).all()
    if m.num_layers < 2:
        return
    # layers [0, 1) then [1, end) equal all layers at once
    first = client.transformer_block(h, first_layer=0, num_layers=1)
    rest = client.transformer_block(first, first_layer=1)
    np.testing.assert_allclose(rest, full, rtol=1e-4, atol=1e-4)


def test_wrong_hidden_size_is_invalid_argument(client):
    m = _model_or_skip(client)
    h = np.zeros((1, 2, m.hidden_size + 1), np.float32)
    with pytest.raises(FusedServeError) as e:
        _block_or_skip(client, h)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "hidden" in e.value.details

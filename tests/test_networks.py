"""The pixel networks (issue 43): parameter counts and output shapes as the references have them, computed here
by hand from the layer sizes, and the choice by observation rank."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fragc.algos.networks import ImpalaCNN, NatureCNN, as_hwc_floats, frames_layout, network_for
from fragc.ir.errors import FragcError


def conv(k, c_in, c_out):
    return k * k * c_in * c_out + c_out


def dense(n_in, n_out):
    return n_in * n_out + n_out


def count(params):
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


def test_the_nature_cnn_has_the_reference_layers():
    # 84 -> 20 (8x8 stride 4) -> 9 (4x4 stride 2) -> 7 (3x3): 7 * 7 * 64 features into the dense 512
    expected = conv(8, 4, 32) + conv(4, 32, 64) + conv(3, 64, 64) + dense(7 * 7 * 64, 512)
    assert expected == 1_684_128
    frames = jnp.zeros((5, 4, 84, 84), jnp.uint8)  # EnvPool's stacked frames, first
    params = jax.eval_shape(NatureCNN("chw").init, jax.random.key(0), frames)  # shapes only: no convolution run
    assert count(params) == expected
    chex.assert_shape(jax.eval_shape(NatureCNN("chw").apply, params, frames), (5, 512))


def test_the_impala_cnn_has_fifteen_convolutions_and_the_reference_count():
    # each of three stacks: a conv, then two residual blocks of two convs; 84 -> 42 -> 21 -> 11 by the pools
    stacks = [(4, 16), (16, 32), (32, 32)]
    expected = sum(conv(3, c_in, c) + 4 * conv(3, c, c) for c_in, c in stacks) + dense(11 * 11 * 32, 256)
    params = jax.eval_shape(ImpalaCNN("chw").init, jax.random.key(0), jnp.zeros((2, 4, 84, 84), jnp.uint8))
    kernels = [p for p in jax.tree.leaves(params) if p.ndim == 4]
    assert len(kernels) == 15
    assert count(params) == expected
    chex.assert_shape(jax.eval_shape(ImpalaCNN("chw").apply, params, jnp.zeros((3, 4, 84, 84), jnp.uint8)), (3, 256))


def test_pixels_are_scaled_in_the_network():
    frames = np.random.default_rng(0).integers(0, 256, (2, 4, 6, 5)).astype(np.uint8)
    expected = np.moveaxis(frames, 1, -1).astype(np.float32) / 255.0  # CleanRL: x / 255.0, channels last
    np.testing.assert_allclose(as_hwc_floats(jnp.asarray(frames), "chw"), expected, rtol=1e-7)
    minatar = (np.arange(2 * 10 * 10 * 4).reshape(2, 10, 10, 4) % 2).astype(np.float32)  # 0/1, channels last
    np.testing.assert_array_equal(as_hwc_floats(jnp.asarray(minatar), "hwc"), minatar)


def test_the_network_is_chosen_from_the_observation_rank():
    assert network_for("auto", (4, 84, 84)) == "nature_cnn"
    assert network_for("auto", (4,)) == "mlp"
    assert network_for("impala_cnn", (10, 10, 4)) == "impala_cnn"
    assert frames_layout((4, 84, 84)) == "chw" and frames_layout((10, 10, 4)) == "hwc"
    with pytest.raises(FragcError, match=r"network nature_cnn needs frames .* this environment's are \(4,\)"):
        network_for("nature_cnn", (4,))
    with pytest.raises(FragcError, match="network must be auto or one of mlp, nature_cnn, impala_cnn"):
        network_for("resnet", (4, 84, 84))

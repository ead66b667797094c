"""The pixel networks (issue 43): parameter counts and output shapes as the references have them, computed here
by hand from the layer sizes, and the choice by observation rank."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fragc.algos.networks import (ImpalaCNN, NatureCNN, Observations, PixelActorCritic, PixelQNetwork, as_hwc_floats,
                                  frames_layout, network_for)
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
    with pytest.raises(FragcError, match="network must be one of auto, mlp, nature_cnn, impala_cnn"):
        network_for("resnet", (4, 84, 84))


def nature_side_left(side):
    """The side of the Nature CNN's last feature map, from frames of side `side`, by the VALID formula."""
    for size, stride in ((8, 4), (4, 2), (3, 1)):
        side = (side - size) // stride + 1
    return side


def test_auto_takes_the_nature_cnn_from_36x36_and_the_impala_cnn_below():
    assert [nature_side_left(s) for s in (84, 36, 35)] == [7, 1, 0]  # 36 is the smallest side it takes
    assert network_for("auto", (2, 36, 36)) == "nature_cnn" and network_for("auto", (36, 36, 3)) == "nature_cnn"
    assert network_for("auto", (2, 35, 36)) == "impala_cnn"
    assert network_for("auto", (10, 10, 4)) == "impala_cnn"  # MinAtar, channels last
    assert network_for("nature_cnn", (2, 36, 36)) == "nature_cnn"
    with pytest.raises(FragcError, match=r"^network nature_cnn needs frames of at least 36x36; this environment's "
                                         r"are 10x10 \(10, 10, 4\) \(use impala_cnn\)$"):
        network_for("nature_cnn", (10, 10, 4))
    params = jax.eval_shape(NatureCNN("chw").init, jax.random.key(0), jnp.zeros((1, 2, 36, 36), jnp.uint8))
    assert count(params) == conv(8, 2, 32) + conv(4, 32, 64) + conv(3, 64, 64) + dense(1 * 1 * 64, 512)


def gram(kernel):
    """K^T K or K K^T of a kernel as a matrix (fan_in, fan_out), the smaller: gain^2 I for an orthogonal one."""
    k = np.asarray(kernel, np.float64).reshape(-1, kernel.shape[-1])
    return k.T @ k if k.shape[0] >= k.shape[1] else k @ k.T


def test_the_nature_cnn_initialises_as_each_reference():
    frames = jax.ShapeDtypeStruct((1, 4, 36, 36), jnp.uint8)
    for name, gain in (("lecun_normal", 1.0), ("he_normal", 2.0)):  # CleanRL's DQN, purejaxql's PQN: gain / fan_in
        params = NatureCNN("chw", kernel_init=name).lazy_init(jax.random.key(1), frames)["params"]  # no forward pass
        kernel = np.asarray(params["Conv_0"]["kernel"])  # 8 * 8 * 4 inputs, 8192 samples
        assert abs(kernel.std() / np.sqrt(gain / (8 * 8 * 4)) - 1) < 0.05, name
        assert all(not np.any(layer["bias"]) for layer in params.values())


def test_purejaxqls_nature_cnn_adds_a_layer_norm_after_every_layer():
    # purejaxql's pqn_atari.py: conv, LayerNorm, relu (three times), dense 512, LayerNorm, relu
    frames = jnp.zeros((1, 4, 84, 84), jnp.uint8)
    plain = jax.eval_shape(NatureCNN("chw").init, jax.random.key(0), frames)["params"]
    params = jax.eval_shape(NatureCNN("chw", "he_normal", layer_norm=True).init, jax.random.key(0), frames)["params"]
    norms = [params[f"LayerNorm_{i}"]["scale"].shape[0] for i in range(4)]
    assert norms == [32, 64, 64, 512] and "LayerNorm_4" not in params
    assert count(params) == count(plain) + 2 * (32 + 64 + 64 + 512)


def test_the_pixel_actor_critic_is_cleanrls_one_torso_and_two_heads():
    atari = PixelActorCritic(NatureCNN("chw"), 6)
    shapes = jax.eval_shape(atari.init, jax.random.key(0), jnp.zeros((2, 4, 84, 84), jnp.uint8))["params"]
    assert set(shapes) == {"torso", "actor", "critic"}  # one torso shared by both heads
    assert count(shapes) == 1_684_128 + dense(512, 6) + dense(512, 1)
    chex.assert_shape(jax.eval_shape(atari.apply, {"params": shapes}, jnp.zeros((2, 4, 84, 84), jnp.uint8)),
                      ((2, 6), (2,)))
    # the heads' initialisation, on a torso of 512 features that costs nothing to initialise
    net = PixelActorCritic(nn.Dense(512, kernel_init=nn.initializers.zeros), 6)
    params = net.lazy_init(jax.random.key(0), jax.ShapeDtypeStruct((2, 3), jnp.float32))["params"]
    np.testing.assert_allclose(gram(params["actor"]["kernel"]), 0.01**2 * np.eye(6), atol=1e-8)  # orthogonal 0.01
    np.testing.assert_allclose(gram(params["critic"]["kernel"]), np.eye(1), atol=1e-5)  # orthogonal 1.0
    assert not np.any(params["actor"]["bias"]) and not np.any(params["critic"]["bias"])
    q = PixelQNetwork(ImpalaCNN("hwc"), 3)
    q_params = jax.eval_shape(q.init, jax.random.key(0), jnp.zeros((1, 10, 10, 4)))["params"]
    assert count(q_params) == count(jax.eval_shape(ImpalaCNN("hwc").init, jax.random.key(0),
                                                   jnp.zeros((1, 10, 10, 4)))) + dense(256, 3)


def test_observations_become_frames_again_in_their_own_dtype():
    frames = np.random.default_rng(0).integers(0, 256, (3, 5, 2, 6, 6)).astype(np.uint8)
    flat = jnp.asarray(frames.reshape(3, 5, -1), jnp.float32)  # as the environments give them
    pixels = Observations((2, 6, 6), np.dtype(np.uint8))
    got = pixels.frames(flat)
    assert got.dtype == jnp.uint8
    np.testing.assert_array_equal(got, frames)  # exact: every uint8 value is a float32 integer
    np.testing.assert_array_equal(pixels.frames(got), frames)  # frames pass
    assert pixels.zeros(1).shape == (1, 2, 6, 6) and pixels.struct(4).dtype == np.uint8
    vectors = Observations((4,))
    assert vectors.frames(flat[..., :4]) is not None and vectors.frames(flat) is flat  # the MLP's: untouched

"""A2C: synchronous advantage actor-critic, discrete actions.

Data collection is PPO's `rollout` fragment (inherited unchanged); learning
is one gradient step per rollout on the GAE advantages (lambda = 1 gives
n-step returns), averaged over learner replicas with `fragc.pmean`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import ppo
from fragc.algos.diagnostics import explained_variance
from fragc.algos.evaluation import EvalConfig
from fragc.algos.run_length import RunLength
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError


@dataclasses.dataclass(frozen=True)
class Config(RunLength, EvalConfig):
    env: str = "CartPole-v1"
    """Environment: a gymnax id, or BACKEND:ID for a host backend (fragc envs); discrete actions."""
    num_envs: int = 8
    """Environments stepped in parallel."""
    num_steps: int = 8
    """Steps per environment in one rollout (the n of n-step returns). A2C takes one gradient step per
    rollout, so small rollouts mean many steps: 8 x 8 gives 15,625 steps in 1e6 env steps (16 x 32 gave
    1,953, and 6 of 10 seeds stalled near a return of 200)."""
    total_steps: int = 1_000_000
    """Environment steps over the whole run."""
    lr: float = 7e-4
    """Adam learning rate (at the start, when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to zero over `total_steps`."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda; 1.0 gives plain n-step returns."""
    ent_coef: float = 0.0
    """Entropy bonus weight (0, as RL Baselines3 Zoo's CartPole A2C: 0.01 kept the policy's entropy near
    0.5 nats of at most 0.69, and returns drifted down late in training)."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden: int = 64
    """Width of the two hidden layers of the actor and of the critic."""
    activation: str = "tanh"
    """Hidden-layer activation: "tanh" or "relu"."""
    network: str = "auto"
    """mlp (the two MLPs above, on the flattened observation), nature_cnn or impala_cnn (CleanRL's Atari
    actor-critic: one CNN torso, a policy and a value head), or auto: a CNN for frames (nature_cnn from 36x36,
    impala_cnn below), the MLP for vectors (docs/pixels.md)."""

    def __post_init__(self) -> None:
        self.check_fields()
        if self.activation not in ppo.ACTIVATIONS:
            raise FragcError(f"{algo_name(self)}: activation must be one of {', '.join(ppo.ACTIVATIONS)}, got "
                             f"{self.activation!r}")


class A2C(ppo.PPO):
    """Advantage actor-critic (Mnih et al. 2016), synchronous, with PPO's rollout fragment."""

    learner_skips_next_obs = True  # its learner bootstraps from V(s_{t+1}), as PPO's

    def __init__(self, config: Config = Config()):
        super().__init__(config)

    def _learning_rate(self) -> Any:
        c = self.config
        return optax.linear_schedule(c.lr, 0.0, c.iterations) if c.anneal_lr else c.lr

    # UPDATE NETWORK: one step on the whole rollout
    def update(self, learner: ppo.Learner, traj: ppo.Transition) -> tuple[ppo.Learner, dict]:
        """One gradient step on the rollout: one `learn` call (PPO's epochs do not apply)."""
        return self.learn(learner, traj)

    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: ppo.Learner, traj: ppo.Transition) -> tuple[ppo.Learner, dict]:
        advantages, targets = ppo.gae(traj, self.config.gamma, self.config.gae_lambda)
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (traj, advantages, targets))
        grads, metrics = jax.grad(self._loss, has_aux=True)(learner.params, *flat)
        grads = fragc.pmean(grads)
        diagnostics = {**self.learning_rate(learner.opt_state),
                       "explained_variance": explained_variance(targets, traj.value)}
        updates, opt_state = self.optimizer.update(grads, learner.opt_state, learner.params)
        learner = learner.replace(params=optax.apply_updates(learner.params, updates), opt_state=opt_state)
        return learner, {**fragc.pmean(metrics), **diagnostics}

    def _loss(self, params: Any, traj: ppo.Transition, advantages: jax.Array, targets: jax.Array
              ) -> tuple[jax.Array, dict]:
        c = self.config
        log_prob, entropy, value = self.evaluate(params, traj.obs, traj.action)
        entropy = jnp.mean(entropy)
        actor_loss = -jnp.mean(log_prob * jax.lax.stop_gradient(advantages))
        value_loss = 0.5 * jnp.mean((value - targets) ** 2)
        loss = actor_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        return loss, {"loss": loss, "actor_loss": actor_loss, "value_loss": value_loss, "entropy": entropy}

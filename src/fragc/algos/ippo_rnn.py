"""Recurrent IPPO and MAPPO on JaxMARL's environments, as JaxMARL's baselines have them (`ippo_rnn_mpe.py`,
`ippo_rnn_smax.py`; MAPPO's in mappo_rnn.py).

Each agent of each environment is a sequence of its own (JaxMARL's actors): a GRU carries its memory, reset where
its episode ended. The rollout and the update are ppo_rnn's (`ppo_rnn.collect`, `ppo_rnn.update`), over the
runner's rows [N, A, D]: minibatches are whole environments' sequences, each with its agents'. Parameters are
shared between agents, as JaxMARL's recurrent baselines share them. The episode statistics and the environment are
IPPO's (ippo.py).

Defaults are JaxMARL's ippo_rnn_mpe.yaml; `preset="auto"` sets ippo_rnn_smax.yaml's values on SMAX. fragc
bootstraps a truncated episode from the value of the state it reached, where JaxMARL's GAE treats every episode
end as terminal (MPE's episodes all end at its time limit; `bootstrap_truncation=False` is JaxMARL's rule):
bench/marl_rnn_reference.py runs both rules beside JaxMARL's own scripts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fragc
from fragc.algos import actor_critic, ippo, ppo, ppo_rnn
from fragc.algos.envs import VecEnv
from fragc.algos.marl_envs import AgentLayout
from fragc.algos.networks import dense
from fragc.algos.ppo_rnn import ACTOR_AXES, Actor, Learner, State, Transition
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError

SMAX = {"lr": 0.004, "num_envs": 128, "num_minibatches": 4, "clip_eps": 0.05, "vf_coef": 0.5, "max_grad_norm": 0.25}
"""JaxMARL's ippo_rnn_smax.yaml, where it differs from ippo_rnn_mpe.yaml."""


@dataclasses.dataclass(frozen=True)
class Config(actor_critic.Config):
    """The actor-critics' fields (actor_critic.py) and PPO's update's, at JaxMARL's ippo_rnn_mpe.yaml values."""

    centralised_critic: ClassVar[bool] = False
    """Whether the critic reads the world state with a GRU of its own (MAPPO's config) or shares the actor's."""
    anneal_clip: ClassVar[bool] = False  # ppo_rnn.update's ratio clip: constant, as JaxMARL's
    smax: ClassVar[dict[str, Any]] = SMAX  # JaxMARL's values for SMAX, which preset=auto applies
    env: str = "jaxmarl:MPE_simple_spread_v3"
    """A JaxMARL environment: jaxmarl:MPE_simple_spread_v3, jaxmarl:SMAX_3m (fragc envs)."""
    num_envs: int = 16
    """Environments stepped in parallel (each with every agent)."""
    total_steps: int = 10_000_000
    """Environment steps over the whole run (JaxMARL's TOTAL_TIMESTEPS: steps of all agents at once)."""
    lr: float = 5e-4
    vf_coef: float = 1.0
    hidden: int = 128
    """Width of the embedding, of the GRU's hidden state and of the actor's and critic's hidden layer (JaxMARL's
    FC_DIM_SIZE and GRU_HIDDEN_DIM)."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 2
    """Minibatches per epoch, each a set of whole environment sequences (num_envs must divide by it)."""
    clip_eps: float = 0.3
    """PPO ratio clip, and the value's clip."""
    clip_value: bool = True
    """Clip the value's change from the rollout's value to `clip_eps` in the value loss (JaxMARL's)."""
    bootstrap_truncation: bool = True
    """Bootstrap a truncated episode from the value of the state it reached (fragc's rule); False: every episode end
    is terminal (JaxMARL's GAE, which MPE's time limit makes every end)."""
    preset: str = "auto"
    """auto: JaxMARL's values for the environment's family (SMAX) on the fields left at their defaults; none: the
    fields as given."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ippo.check_agents_config(self)
        if self.num_envs % self.num_minibatches:
            raise FragcError(f"{algo_name(self)}: num_envs ({self.num_envs}) must divide by num_minibatches "
                             f"({self.num_minibatches}): minibatches are whole environment sequences")


class Memory(nn.Module):
    """An embedding (a dense relu layer) and a GRU: (carry [B, H], obs [T, B, D], resets [T, B]) -> (carry,
    features [T, B, H])."""

    hidden: int

    @nn.compact
    def __call__(self, carry: jax.Array, obs: jax.Array, resets: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.relu(dense(self.hidden, np.sqrt(2))(obs))
        return ppo_rnn.ScannedGRU(self.hidden)(carry, (x, resets))


class AgentsActorCriticRNN(nn.Module):
    """JaxMARL's recurrent actor-critic on agents' rows: a memory (`Memory`) of the agent's own observation, then the
    actor's head (a dense relu layer, then the logits, unavailable actions at -1e10). The critic's head reads the same
    memory (IPPO's ActorCriticRNN), or a memory of the world state of its own (MAPPO's CriticRNN), whose carry lies
    beside the actor's. The critic's parameters are those whose names start with `critic` (`critic_part`)."""

    layout: AgentLayout
    hidden: int
    centralised: bool

    @nn.compact
    def __call__(self, carry: jax.Array, rows: jax.Array, resets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(carry [B..., H or 2H], rows [T, B..., D], resets [T, B...]) -> (carry after T steps, logits [T, B..., K],
        value [T, B...]); B... any batch shape (environments, agents), each element a sequence of its own."""
        lead = resets.shape
        rows, resets = rows.reshape((lead[0], -1, rows.shape[-1])), resets.reshape(lead[0], -1)
        carry = carry.reshape((-1, carry.shape[-1]))
        actor_carry, critic_carry = jnp.split(carry, 2, -1) if self.centralised else (carry, None)
        carry, x = Memory(self.hidden, name="actor_memory" if self.centralised else "memory")(
            actor_carry, self.layout.own(rows), resets)
        logits = dense(self.layout.num_actions, 0.01, "actor_out")(nn.relu(dense(self.hidden, 2.0, "actor_hidden")(x)))
        mask = self.layout.mask(rows)
        logits = logits if mask is None else jnp.where(mask, logits, -1e10)
        if self.centralised:
            critic_carry, x = Memory(self.hidden, name="critic_memory")(critic_carry, self.layout.world(rows), resets)
            carry = jnp.concatenate([carry, critic_carry], -1)
        value = dense(1, 1.0, "critic_out")(nn.relu(dense(self.hidden, 2.0, "critic_hidden")(x)))
        return carry.reshape(lead[1:] + (-1,)), logits.reshape(lead + (-1,)), jnp.squeeze(value, -1).reshape(lead)


def critic_part(params: Any) -> Any:
    """Each parameter labelled `critic` or `actor`, by its module's name."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "critic" if str(path[1].key).startswith("critic") else "actor", params)


class IPPORNN:
    """Recurrent independent PPO: JaxMARL's ippo_rnn baseline."""

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = ippo.with_preset(self.Config() if config is None else config)
        self.steps_per_iteration = self.config.steps_per_iteration

    @functools.cached_property
    def env(self) -> VecEnv:
        return ippo.agents_env(self.config)

    @functools.cached_property
    def network(self) -> AgentsActorCriticRNN:
        return AgentsActorCriticRNN(self.env.layout, self.config.hidden, self.config.centralised_critic)

    @property
    def carry_size(self) -> int:
        """The carry of one agent's memory: the actor's GRU's, and with a centralised critic the critic's beside it."""
        return self.config.hidden * (2 if self.config.centralised_critic else 1)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """PPO's (ppo.py). With a centralised critic, as JaxMARL's MAPPO has an optimizer for the actor and another
        for the critic, each clips its own gradient's norm (Adam's moments are per parameter: one Adam is the two).
        Built where it is used, for sweeps."""
        c = self.config
        if not c.centralised_critic:
            return ppo.optimizer(c)
        clip = optax.clip_by_global_norm(c.max_grad_norm)
        return optax.chain(optax.multi_transform({"actor": clip, "critic": clip}, critic_part),
                           optax.adam(ppo.learning_rate(c), eps=1e-5))

    def init(self, key: jax.Array) -> State:
        c = self.config
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.network.init(k_params, jnp.zeros((1, self.carry_size)), jnp.zeros((1, 1, self.env.obs_size)),
                                   jnp.zeros((1, 1), bool))
        learner = Learner(params, self.optimizer.init(params), k_learn, jnp.int32(0))
        agents = (c.num_envs, self.env.num_agents)
        actor = Actor(self.env.reset(k_env, c.num_envs), jnp.zeros(agents + (self.carry_size,)), jnp.zeros(agents, bool))
        return State(learner, actor)

    def iteration(self, state: State) -> tuple[State, dict]:
        traj, actor, episode_metrics = self.rollout(state.learner.params, state.actor)
        learner, loss_metrics = self.learn(state.learner, traj)
        return state.replace(learner=learner, actor=actor), {**episode_metrics, **loss_metrics}

    # COLLECT TRAJECTORIES: one GRU step per agent and environment step
    @fragc.fragment(role="actor", in_axes=(None, ACTOR_AXES), out_axes=(1, ACTOR_AXES, None))
    def rollout(self, params: Any, actor: Actor) -> tuple[Transition, Actor, dict]:
        return ppo_rnn.collect(self.network, self.env, params, actor, self.config.num_steps,
                               functools.partial(ippo.agents_episode_metrics, self.env), ippo.episodes_ended)

    # UPDATE NETWORK: ppo_rnn's update, minibatches of whole environments' sequences with their agents'
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Learner, traj: Transition) -> tuple[Learner, dict]:
        if not self.config.bootstrap_truncation:
            traj = traj.replace(terminated=traj.done)
        return ppo_rnn.update(learner, traj, self.config, self.network, self.optimizer)

    # THE DETERMINISTIC POLICY: what fragc.load_policy acts with
    def policy_params(self, state: State) -> Any:
        return state.learner.params

    def initial_carry(self, n: int) -> jax.Array:
        """The carry of `n` environments' agents at an episode's start [n, A, carry_size]."""
        return jnp.zeros((n, self.env.num_agents, self.carry_size))

    def greedy_step(self, params: Any, carry: jax.Array, rows: jax.Array, reset: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
        """One step of every agent's most probable action: (carry [n, A, C], rows [n, A, D], reset [n, A]) ->
        (carry, actions [n, A])."""
        carry, logits, _ = self.network.apply(params, carry, rows[None], reset[None])
        return carry, jnp.argmax(logits[0], -1)

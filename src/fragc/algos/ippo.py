"""IPPO and MAPPO on JaxMARL's environments (`jaxmarl:MPE_simple_spread_v3`, `jaxmarl:SMAX_3m`).

PPO's rollout and update run unchanged on the agent axis: the runner's observations are [N, A, D] (src/fragc/algos/marl_envs.py),
the rollout samples one action per agent, and the trajectory is [T, N, A, ...]; the learner's minibatches hold
every agent's step. What differs is the network: each agent's actor reads its own observation (logits masked to
the available actions on SMAX), IPPO's critic its own observation too, MAPPO's the world state (a centralised
critic). Parameters are shared between agents (JaxMARL's baselines), or with `shared_params=False` each agent holds
its own, stacked over a leading agent axis: the rollout vmaps the network over the agents, and the learner is the
fragment `learn_agents`, PPO's `update` vmapped over the agents, which declares its agent axes, so that a policy can
place the agents' learners on devices of their own (`agent_learners`, docs/marl.md).

Defaults are JaxMARL's feed-forward IPPO on MPE (baselines/IPPO/config/ippo_ff_mpe.yaml); `preset="auto"` sets
JaxMARL's values for SMAX (ippo_rnn_smax.yaml, mappo_homogenous_rnn_smax.yaml: their networks are recurrent, these
are feed-forward) on the fields left at their defaults.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import ppo
from fragc.algos.actor_critic import Categorical, Learner, State, Transition, collect
from fragc.algos.diagnostics import episode_metrics
from fragc.algos.envs import Runner, VecEnv, split_env_name
from fragc.algos.marl_envs import AgentLayout, AgentsRunner
from fragc.algos.networks import MLP, ChosenNetwork
from fragc.algos.validation import algo_name
from fragc.ir.errors import FragcError


SMAX = {"lr": 0.004, "num_envs": 128, "clip_eps": 0.05, "max_grad_norm": 0.25, "activation": "relu", "hidden": 128}
"""JaxMARL's SMAX baselines (IPPO's and MAPPO's configs agree on these)."""


@dataclasses.dataclass(frozen=True)
class Config(ppo.Config):
    centralised_critic: ClassVar[bool] = False
    """Whether the critic reads the world state (MAPPO's config) or each agent's own observation (IPPO's)."""
    env: str = "jaxmarl:MPE_simple_spread_v3"
    """A JaxMARL environment: jaxmarl:MPE_simple_spread_v3, jaxmarl:SMAX_3m (fragc envs)."""
    num_envs: int = 16
    """Environments stepped in parallel (each with every agent)."""
    total_steps: int = 10_000_000
    """Environment steps over the whole run (JaxMARL's TOTAL_TIMESTEPS: steps of all agents at once)."""
    shared_params: bool = True
    """One network for every agent (JaxMARL's baselines); False: each agent its own, stacked over an agent axis."""
    smax: ClassVar[dict[str, Any]] = SMAX
    """JaxMARL's values for SMAX, which preset=auto applies."""
    preset: str = "auto"
    """auto: JaxMARL's values for the environment's family (SMAX) on the fields left at their defaults; none: the
    fields as given."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_agents_config(self)


def check_agents_config(config: Any) -> None:
    """What every multi-agent config refuses (IPPO's, MAPPO's and their recurrent ones'): an unknown preset, and
    evaluation episodes, which take one agent's greedy action."""
    if config.preset not in ("auto", "none"):
        raise FragcError(f"{algo_name(config)}: preset must be auto or none, got {config.preset!r}")
    if config.eval_every:
        raise FragcError(f"{algo_name(config)}: evaluation episodes (eval_every) take one agent's greedy action; "
                         "the multi-agent algorithms have none yet: leave eval_every at 0")


def with_preset(config: Config) -> Config:
    """`config` with its family's preset on the fields that still hold their class defaults."""
    if config.preset != "auto" or "SMAX_" not in config.env:
        return config
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    return dataclasses.replace(config, **{k: v for k, v in config.smax.items() if getattr(config, k) == defaults[k]})


class AgentsActorCritic(nn.Module):
    """PPO's two MLPs on an agent's row: the actor on its own observation (logits of unavailable actions pushed
    to -1e10, as JaxMARL masks them), the critic on its own observation (IPPO) or the world state (MAPPO)."""

    layout: AgentLayout
    hidden: int
    activation: str
    centralised: bool

    def setup(self) -> None:
        self.actor = MLP(self.hidden, self.layout.num_actions, 0.01, self.activation)
        self.critic = MLP(self.hidden, 1, 1.0, self.activation)

    def __call__(self, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = self.actor(self.layout.own(rows))
        mask = self.layout.mask(rows)
        return (logits if mask is None else jnp.where(mask, logits, -1e10)), self.value(rows)

    def value(self, rows: jax.Array) -> jax.Array:
        return jnp.squeeze(self.critic(self.layout.world(rows) if self.centralised else self.layout.own(rows)), -1)


def per_agent(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` for each agent on its own slice of parameters stacked over a leading agent axis (its own norm clip)."""
    return optax.GradientTransformation(jax.vmap(tx.init), jax.vmap(tx.update))


AGENT_LEARNER = Learner(params=0, opt_state=0, key=None)
"""The agent axes of a learner whose agents hold their own parameters: its parameters and optimizer state are
stacked over agents, the minibatch key is one for all."""

AGENT_RUNNER = AgentsRunner(env_state=None, obs=1, key=None, episode_return=1, last_return=1, has_return=1,
                            episode_length=1, last_length=1, last_won=None)
"""The agent axes of the runner: each agent's observation row and episode statistics ([N, A, ...]); JaxMARL's
states, the keys and the win flags are the environment's."""


def agents_env(config: Any) -> VecEnv:
    """The JaxMARL environment a multi-agent config names (each agent's row with the world state for a centralised
    critic), or one line refusing a single-agent one."""
    if split_env_name(config.env)[0] != "jaxmarl":
        raise FragcError(f"{algo_name(config)} is a multi-agent algorithm; {config.env} is a single-agent environment "
                         "(use ppo, or a jaxmarl: environment)")
    return VecEnv(config.env, world_state=config.centralised_critic)


def agents_episode_metrics(env: Any, runner: Runner) -> dict:
    """The team's statistics (each agent's last episode, averaged as JaxMARL logs them), each agent's return, and on
    SMAX the fraction of environments whose last episode was won."""
    metrics = episode_metrics(runner)
    completed = jnp.maximum(fragc.psum(jnp.sum(runner.has_return, 0)), 1)
    agents = fragc.psum(jnp.sum(runner.last_return * runner.has_return, 0)) / completed
    metrics.update({f"episode_return_agent{i}": agents[i] for i in range(env.num_agents)})
    if env.smax:
        finished = runner.has_return[:, 0]
        metrics["win_rate"] = (fragc.psum(jnp.sum(runner.last_won * finished))
                               / jnp.maximum(fragc.psum(jnp.sum(finished)), 1))
    return metrics


def episodes_ended(done: jax.Array) -> jax.Array:
    """The environments' episodes that ended ([T, N, A] `done`): an episode ends for every agent at once (an agent's
    own `done` comes earlier where it dies, on SMAX), so where all agents are done."""
    return fragc.psum(jnp.sum(jnp.all(done, -1)))


# The fragments' bodies: the class below declares each with its agent axes.


def rollout(algo: "IPPO", params: Any, runner: Runner) -> tuple[Transition, Runner, dict]:
    """The actor-critics' rollout on the agents' rows: the trajectory is [T, N, A, ...]."""
    return collect(algo.model, algo.env, params, runner, algo.config.num_steps, False,
                   functools.partial(agents_episode_metrics, algo.env), episodes_ended)


def learn(algo: "IPPO", learner: Learner, traj: Transition) -> tuple[Learner, dict]:
    """PPO's update on every agent's steps (shared parameters)."""
    return ppo.update(learner, traj, algo.config, algo.model, algo.optimizer)


def learn_agents(algo: "IPPO", learner: Learner, traj: Transition) -> tuple[Learner, dict]:
    """Each agent's own parameters: PPO's update for one agent, vmapped over the agent axis."""
    update = functools.partial(ppo.update, config=algo.config, model=algo.model.one_agent(),
                               tx=ppo.optimizer(algo.config))
    return jax.vmap(update, in_axes=(AGENT_LEARNER, 2), out_axes=(AGENT_LEARNER, 0))(learner, traj)


class IPPO:
    """Independent PPO (de Witt et al. 2020), JaxMARL's baseline: each agent's critic sees its own observation."""

    Config = Config

    def __init__(self, config: Config | None = None):
        self.config = with_preset(self.Config() if config is None else config)
        self.steps_per_iteration = self.config.steps_per_iteration
        shared = self.config.shared_params
        self.rollout = self.rollout_shared if shared else self.rollout_agents
        self.learn = self.learn_shared if shared else self.learn_agents

    @functools.cached_property
    def env(self) -> VecEnv:
        return agents_env(self.config)

    @property
    def num_agents(self) -> int:
        return self.env.num_agents

    @functools.cached_property
    def model(self) -> Categorical:
        """Every agent's actor-critic, its parameters stacked over the agents where each holds its own."""
        c = self.config
        if ChosenNetwork.of(c.network, self.env).name != "mlp":
            raise FragcError(f"{algo_name(c)}: network must be mlp (or auto), got {c.network!r}")
        network = AgentsActorCritic(self.env.layout, c.hidden, c.activation, c.centralised_critic)
        return Categorical(network, ChosenNetwork.of("mlp", self.env), 0 if c.shared_params else self.num_agents)

    @property
    def optimizer(self) -> optax.GradientTransformation:
        """PPO's; each agent's own where each holds its parameters. Built where it is used, for sweeps."""
        return ppo.optimizer(self.config) if self.config.shared_params else per_agent(ppo.optimizer(self.config))

    def init(self, key: jax.Array) -> State:
        k_params, k_env, k_learn = jax.random.split(key, 3)
        params = self.model.init(k_params)
        learner = Learner(params, self.optimizer.init(params), k_learn)
        return State(learner, self.env.reset(k_env, self.config.num_envs))

    def iteration(self, state: State) -> tuple[State, dict]:
        traj, runner, episode_metrics = self.rollout(state.learner.params, state.runner)
        learner, loss_metrics = self.learn(state.learner, traj)
        return state.replace(learner=learner, runner=runner), {**episode_metrics, **loss_metrics}

    # COLLECT TRAJECTORIES, with the parameters shared or one set per agent
    rollout_shared = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None),
                                    agent_axes=((None, AGENT_RUNNER), (2, AGENT_RUNNER, None)))(rollout)
    rollout_agents = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None),
                                    agent_axes=((0, AGENT_RUNNER), (2, AGENT_RUNNER, None)))(rollout)
    # UPDATE NETWORKS: one for every agent, or each agent's own (a policy may place them on devices of their own)
    learn_shared = fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None),
                                  agent_axes=((None, 2), (None, None)))(learn)
    learn_agents = fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None),
                                  agent_axes=((AGENT_LEARNER, 2), (AGENT_LEARNER, 0)))(learn_agents)

    def policy_params(self, state: State) -> Any:
        return state.learner.params

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """Each agent's most probable action for rows [n, A, D]."""
        return self.model.greedy(params, obs)

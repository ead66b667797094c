"""Every gymnax environment can be named, with an algorithm whose spaces it supports."""

import pytest

import fragc
from fragc.algos import dqn, envs, ppo, ppo_continuous

# fragc's names and `make`, not gymnax's module: fragc imports gymnax without its renderers' seaborn and pyplot,
# which a plain `import gymnax` here cost each xdist worker (every worker collects every file) 3.6 s
OFFLINE = [name for name in envs.env_names() if name != "MNISTBandit-bsuite"]  # that one downloads MNIST


MINATAR_IN_SLOW = {"Asterix-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar"}
"""MinAtar's games but Breakout run with -m slow (2-3 s each, the default suite's 6 minutes): the same gymnax wrapper
and the same PPO trace their 10x10xC frames; Breakout's cell keeps the pixel path in the default suite."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in MINATAR_IN_SLOW else n
                                  for n in OFFLINE])
def test_environment_traces_with_a_matching_algorithm(name):
    env, params = envs.make(name)
    small = dict(env=name, num_envs=4, num_steps=4, num_minibatches=2)
    if type(env.action_space(params)).__name__ == "Discrete":
        algo = ppo.PPO(ppo.Config(**small))
    else:
        algo = ppo_continuous.PPOContinuous(ppo_continuous.Config(**small))
    module = fragc.trace(algo)  # traces init and iteration, and refuses a state that does not come back the same
    text = str(module)
    returned = " ".join(text[text.index("  return state="):].split())  # the return, wrapped at 120
    assert "episode_return: " in returned.split("metrics=")[1] and set(module.fragments) == {"rollout", "learn"}


@pytest.mark.parametrize("algo,env,message", [
    (lambda: ppo.PPO(ppo.Config(env="Pendulum-v1")), "Pendulum-v1", "ppo supports discrete action spaces"),
    (lambda: dqn.DQN(dqn.Config(env="MountainCarContinuous-v0")), "", "dqn supports discrete action spaces"),
    (lambda: ppo_continuous.PPOContinuous(ppo_continuous.Config(env="Acrobot-v1")), "", "ppo_continuous supports continuous"),
])
def test_unsupported_spaces_get_a_clear_error(algo, env, message):
    with pytest.raises(fragc.FragcError, match=message):
        fragc.trace(algo())


def test_a_module_gymnax_imports_for_rendering_loads_on_first_use(monkeypatch):
    """gymnax imports seaborn and matplotlib.pyplot for its renderers (~1 s of each process's start); fragc
    imports gymnax with stand-ins that import the real module when a renderer first reads it."""
    import importlib
    import subprocess
    import sys

    from fragc.algos.envs import _OnFirstUse

    monkeypatch.delitem(sys.modules, "tabnanny", raising=False)  # a module nothing here imports
    stand_in = _OnFirstUse("tabnanny")
    assert "tabnanny" not in sys.modules and not hasattr(stand_in, "__file__")  # dunders do not load it
    assert stand_in.check is importlib.import_module("tabnanny").check  # first use: the real module
    assert stand_in.NannyNag is sys.modules["tabnanny"].NannyNag
    script = ("import sys; from fragc.algos.envs import make; make('CartPole-v1'); "
              "print(sorted(m for m in ('seaborn', 'matplotlib.pyplot') if m in sys.modules)); "
              "import gymnax.environments.misc.pong as pong; print(type(pong.sns).__name__, type(pong.plt).__name__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # none imported by make; a renderer's module holds stand-ins, which load the real one on first use (above)
    assert out.stdout.split() == ["[]", "_OnFirstUse", "_OnFirstUse"]

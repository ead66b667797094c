"""Build the reference implementations' own code, at pinned commits, into bench/references/build/ (gitignored).

Third-party code is never committed: each reference's files are copied out of a git mirror (a bare mirror or a
clone) at the commit pinned in REFERENCES below, and the few patches listed there are applied, each asserted to
match its text exactly once at that commit, so a changed upstream fails here, loudly, instead of running something
else. The patches only let the code import and run on this project's library versions (jax 0.10.2, flax 0.12.8,
gymnax 1.0.1, jaxmarl 0.2.0, envpool 1.2, gymnasium 1.3, pgx 2.6.0, mctx 0.0.71, dm-haiku 0.0.17), without packages
it does not use and without the network; each says why, the algorithms are left as written, and the scripts'
`__main__` blocks are untouched (`make_train` imports without them), but for pgx's AlphaZero, whose training loop is
its `__main__` block: there, one jax call that jax 0.10 removed is replaced.

Each reference lands in build/<name>/ with a REFERENCE.json (repository, commit, files, patches), so a bench can
`sys.path.insert(0, "bench/references/build/purejaxrl"); import ppo; ppo.make_train(config)` and print the
revision it ran. `python bench/references/verify.py` then runs each one on a tiny configuration.

    python bench/references/build.py [--purejaxrl PATH] [--purejaxql PATH] [--jaxmarl PATH] [--cleanrl PATH]
                                     [--pgx PATH] [--out bench/references/build]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIRRORS = {  # the CLI option naming each mirror -> where it is looked for when the option is not given
    "purejaxrl": "/work/.mirror/luchris429+purejaxrl/repo",
    "purejaxql": "/work/.mirror/mttga+purejaxql/repo",
    "jaxmarl": "/work/.mirror/FLAIROx+JaxMARL/repo",
    "cleanrl": "/work/.mirror/vwxyzjn+cleanrl/repo",
    "pgx": "/work/.mirror/sotetsuk+pgx/repo",
}
MARK = "# patched (fragc bench/references/build.py):"


@dataclass(frozen=True)
class Patch:
    """Replace `old` (which must occur exactly once in `file`, a path under build/<name>/) by `new`."""

    file: str
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Reference:
    name: str  # build/<name>/
    mirror: str  # the key of MIRRORS (and CLI option) giving its git mirror
    url: str
    commit: str
    files: dict[str, str]  # path at the commit -> path under build/<name>/
    patches: tuple[Patch, ...] = ()
    note: str = ""
    ref: str = ""  # where the commit is, when not on the default branch (a mirror fetches it: git fetch URL REF)


# gymnax >= 1.0 steps return (obs, state, reward, terminated, truncated, info), and its info gains "terminated",
# "truncated" and "final_observation"; PureJaxRL and purejaxql were written against gymnax 0.0.x's
# (obs, state, reward, done, info). Both fold it back the same way: done = terminated | truncated (what 0.0.x's
# done was), and the three new info entries dropped (their metrics are the whole info dict).
GYMNAX_1_KEYS = '("terminated", "truncated", "final_observation")'

PUREJAXRL_FOLD = f'''def _gymnax_0_step(out):
    {MARK} gymnax >= 1.0 returns (obs, state, reward, terminated,
    # truncated, info); fold it back to gymnax 0.0.x's (obs, state, reward, done, info) that this file was written
    # for, done = terminated | truncated. A 5-tuple (BraxGymnaxWrapper's) passes unchanged.
    if len(out) == 5:
        return out
    obs, state, reward, terminated, truncated, info = out
    info = {{k: v for k, v in info.items() if k not in {GYMNAX_1_KEYS}}}
    return obs, state, reward, jnp.logical_or(terminated, truncated), info


class GymnaxWrapper(object):'''

PUREJAXRL = Reference(
    name="purejaxrl",
    mirror="purejaxrl",
    url="https://github.com/luchris429/purejaxrl",
    commit="31756b197773a52db763fdbe6d635e4b46522a73",
    files={f"purejaxrl/{f}": f for f in ("ppo.py", "ppo_rnn.py", "ppo_continuous_action.py", "wrappers.py")},
    patches=(
        Patch(
            "wrappers.py",
            "from brax import envs\nfrom brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper\n"
            "import navix as nx\n",
            f"try:  {MARK} brax only for BraxGymnaxWrapper (ppo_continuous_action.py)\n"
            "    from brax import envs\n"
            "    from brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper\n"
            "except ImportError:\n    pass\n"
            f"try:  {MARK} navix only for NavixGymnaxWrapper (ppo_minigrid.py, not built)\n"
            "    import navix as nx\n"
            "except ImportError:\n    pass\n",
            "brax and navix made optional: ppo.py and ppo_rnn.py use neither, and navix is not installed",
        ),
        Patch("wrappers.py", "class GymnaxWrapper(object):", PUREJAXRL_FOLD,
              "defines _gymnax_0_step, the fold of gymnax 1.0's step result used by the two patches below"),
        Patch(
            "wrappers.py",
            "        obs, state, reward, done, info = self._env.step(key, state, action, params)\n"
            "        obs = jnp.reshape(obs, (-1,))\n",
            "        obs, state, reward, done, info = _gymnax_0_step(self._env.step(key, state, action, params))\n"
            "        obs = jnp.reshape(obs, (-1,))\n",
            "FlattenObservationWrapper.step calls gymnax's step directly: fold its 6-tuple (gymnax 1.0)",
        ),
        Patch(
            "wrappers.py",
            "        obs, env_state, reward, done, info = self._env.step(\n"
            "            key, state.env_state, action, params\n"
            "        )\n"
            "        new_episode_return = state.episode_returns + reward\n",
            "        obs, env_state, reward, done, info = _gymnax_0_step(self._env.step(\n"
            "            key, state.env_state, action, params\n"
            "        ))\n"
            "        new_episode_return = state.episode_returns + reward\n",
            "LogWrapper.step may wrap gymnax's step directly (or Brax's 5-tuple): fold a 6-tuple (gymnax 1.0)",
        ),
        Patch(
            "ppo_rnn.py",
            "        new_rnn_state, y = nn.GRUCell()(rnn_state, ins)\n",
            f"        {MARK} flax >= 0.7.1 GRUCell needs its features\n"
            "        new_rnn_state, y = nn.GRUCell(features=rnn_state.shape[-1])(rnn_state, ins)\n",
            "flax >= 0.7.1: nn.GRUCell takes `features`, which older flax read off the carry's last axis",
        ),
        Patch(
            "ppo_rnn.py",
            "        return nn.GRUCell.initialize_carry(\n"
            "            jax.random.PRNGKey(0), (batch_size,), hidden_size\n"
            "        )\n",
            f"        {MARK} flax >= 0.7.1 initialize_carry is a method\n"
            "        return nn.GRUCell(features=hidden_size).initialize_carry(\n"
            "            jax.random.PRNGKey(0), (batch_size, hidden_size)\n"
            "        )\n",
            "flax >= 0.7.1: GRUCell.initialize_carry is a method taking the input shape (zeros, as before)",
        ),
    ),
)

PUREJAXQL = Reference(
    name="purejaxql",
    mirror="purejaxql",
    url="https://github.com/mttga/purejaxql",
    commit="47af6d7b35c89ddfe633aaf7341bdb8964cb7cce",
    files={"purejaxql/pqn_gymnax.py": "pqn_gymnax.py", "purejaxql/config/config.yaml": "config/config.yaml",
           "purejaxql/config/alg/pqn_cartpole.yaml": "config/alg/pqn_cartpole.yaml"},
    patches=(
        Patch(
            "pqn_gymnax.py",
            "    vmap_step = lambda n_envs: lambda rng, env_state, action: jax.vmap(\n"
            "        env.step, in_axes=(0, 0, 0, None)\n"
            "    )(jax.random.split(rng, n_envs), env_state, action, env_params)\n",
            "    def _gymnax_0_step(key, state, action, params):\n"
            f"        {MARK} gymnax >= 1.0 returns (obs, state, reward,\n"
            "        # terminated, truncated, info): gymnax 0.0.x's 5-tuple, done = terminated | truncated\n"
            "        obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)\n"
            f"        info = {{k: v for k, v in info.items() if k not in {GYMNAX_1_KEYS}}}\n"
            "        return obs, state, reward, jnp.logical_or(terminated, truncated), info\n\n"
            "    vmap_step = lambda n_envs: lambda rng, env_state, action: jax.vmap(\n"
            "        _gymnax_0_step, in_axes=(0, 0, 0, None)\n"
            "    )(jax.random.split(rng, n_envs), env_state, action, env_params)\n",
            "gymnax 1.0's LogWrapper.step returns a 6-tuple that both of the script's steps unpack as 5 (purejaxql "
            "pins gymnax 0.0.6); its new final_observation entry would also break the test metrics' jnp.where",
        ),
    ),
)

JAXMARL = Reference(
    name="jaxmarl",
    mirror="jaxmarl",
    url="https://github.com/FLAIROx/JaxMARL",
    commit="c793d095618c6d3edfb5632802348f57b70a4b94",
    files={"baselines/IPPO/ippo_ff_mpe.py": "ippo_ff_mpe.py",
           "baselines/IPPO/config/ippo_ff_mpe.yaml": "config/ippo_ff_mpe.yaml",
           "baselines/IPPO/ippo_rnn_mpe.py": "ippo_rnn_mpe.py",
           "baselines/IPPO/config/ippo_rnn_mpe.yaml": "config/ippo_rnn_mpe.yaml",
           "baselines/MAPPO/mappo_rnn_mpe.py": "mappo_rnn_mpe.py",
           "baselines/MAPPO/config/mappo_homogenous_rnn_mpe.yaml": "config/mappo_homogenous_rnn_mpe.yaml"},
    note="MAPPO has no feed-forward MPE script in JaxMARL; mappo_rnn_mpe.py (GRU) is the closest. The scripts "
         "import the installed jaxmarl package (0.2.0), not the repository's. Their per-update io_callback calls "
         "wandb.log: call wandb.init(mode='disabled') before running make_train's train.",
)

CLEANRL = Reference(
    name="cleanrl",
    mirror="cleanrl",
    url="https://github.com/vwxyzjn/cleanrl",
    commit="fe8d8a03c41a7ef5b523e2e354bd01c363e786bb",
    files={"cleanrl/ppo_atari_envpool_xla_jax.py": "ppo_atari_envpool_xla_jax.py"},
    patches=(
        Patch("ppo_atari_envpool_xla_jax.py", "import gym\nimport jax\n",
              f"import gymnasium as gym  {MARK} envpool >= 1.0 returns gymnasium's spaces\nimport jax\n",
              "envpool 1.2's env_type='gym' pools return gymnasium spaces: the script's only use of gym, "
              "isinstance(space, gym.spaces.Discrete), fails against gym's classes (and gym is not installed)"),
        Patch("ppo_atari_envpool_xla_jax.py", "from torch.utils.tensorboard import SummaryWriter\n",
              f"from tensorboardX import SummaryWriter  {MARK} the same writer, without torch\n",
              "torch is imported only for its SummaryWriter; tensorboardX (fragc[tensorboard]) is the same API, "
              "and torch from PyPI brings gigabytes of CUDA wheels"),
        Patch("ppo_atari_envpool_xla_jax.py",
              "class AgentParams:\n"
              "    network_params: flax.core.FrozenDict\n"
              "    actor_params: flax.core.FrozenDict\n"
              "    critic_params: flax.core.FrozenDict\n",
              "class AgentParams:\n"
              "    network_params: flax.core.FrozenDict\n"
              "    actor_params: flax.core.FrozenDict\n"
              "    critic_params: flax.core.FrozenDict\n\n"
              f"    def __contains__(self, key):  {MARK} flax's TrainState asks\n"
              "        return False  # `\"overwrite_with_gradient\" in params` (and grads): a dataclass has no keys\n",
              "flax >= 0.8's TrainState.create and apply_gradients test `OVERWRITE_WITH_GRADIENT in params`, which a "
              "flax.struct dataclass of parameters cannot answer (TypeError); it holds no such key: False"),
        Patch("ppo_atari_envpool_xla_jax.py",
              "    envs.num_envs = args.num_envs\n"
              "    envs.single_action_space = envs.action_space\n"
              "    envs.single_observation_space = envs.observation_space\n"
              "    envs.is_vector_env = True\n",
              f"    {MARK} envpool >= 1.0 pools are gymnasium VectorEnvs, whose\n"
              "    # num_envs, single_action_space, single_observation_space, is_vector_env are read-only, as set\n",
              "envpool 1.2's pools already have these four as read-only properties with these values: setting "
              "them raises AttributeError"),
        Patch("ppo_atari_envpool_xla_jax.py",
              "        handle, (next_obs, reward, next_done, info) = step_env(handle, action)\n",
              f"        {MARK} envpool >= 1.0 steps return gymnasium's\n"
              "        # (obs, reward, terminated, truncated, info): fold it back to envpool 0.8's gym 4-tuple\n"
              "        handle, (next_obs, reward, terminated, truncated, info) = step_env(handle, action)\n"
              "        next_done = jnp.logical_or(terminated, truncated)\n"
              "        info[\"TimeLimit.truncated\"] = truncated\n",
              "envpool 1.2's XLA step returns gymnasium's 5-tuple: done = terminated | truncated and "
              "info['TimeLimit.truncated'] = truncated, as envpool 0.8's gym API gave them"),
        Patch("ppo_atari_envpool_xla_jax.py", "    next_obs = envs.reset()\n",
              f"    next_obs, _ = envs.reset()  {MARK} gymnasium's reset returns (obs, info)\n",
              "envpool 1.2's reset returns gymnasium's (obs, info)"),
    ),
    note="A whole script (tyro arguments, under `if __name__ == '__main__'`): run it with tiny arguments.",
)

CLEANRL_SAC = Reference(
    name="cleanrl_sac",
    mirror="cleanrl",
    url="https://github.com/vwxyzjn/cleanrl",
    commit="8eea5b431f48d1b75da7b06089b96a70d2049101",
    ref="refs/pull/519/head",
    files={"cleanrl/sac_continuous_action_jax.py": "sac_continuous_action_jax.py",
           "cleanrl_utils/__init__.py": "cleanrl_utils/__init__.py",
           "cleanrl_utils/buffers.py": "cleanrl_utils/buffers.py"},
    patches=(
        Patch("sac_continuous_action_jax.py",
              "        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) "
              "for i in range(args.num_envs)]\n    )\n",
              "        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) "
              "for i in range(args.num_envs)],\n"
              f"        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,  {MARK} gymnasium 0.29's autoreset\n"
              "    )\n",
              "gymnasium >= 1.0 resets a finished environment on the next step; SAME_STEP keeps 0.29's reset in "
              "the same step (which the script's final-observation handling assumes; CleanRL pins gymnasium 0.29.1)"),
        Patch("sac_continuous_action_jax.py",
              "            for info in infos[\"final_info\"]:\n"
              "                if info is not None:\n"
              "                    print(f\"global_step={global_step}, episodic_return={info['episode']['r']}\")\n"
              "                    writer.add_scalar(\"charts/episodic_return\", info[\"episode\"][\"r\"], "
              "global_step)\n"
              "                    writer.add_scalar(\"charts/episodic_length\", info[\"episode\"][\"l\"], "
              "global_step)\n"
              "                    break\n",
              f"            {MARK} gymnasium >= 1.0's final_info is one dict of\n"
              "            # per-environment arrays (\"_episode\" marks the finished ones), not a list of dicts\n"
              "            final = infos[\"final_info\"]\n"
              "            episode, finished = final[\"episode\"], final[\"_episode\"]\n"
              "            for idx in np.flatnonzero(finished):\n"
              "                print(f\"global_step={global_step}, episodic_return={episode['r'][idx]}\")\n"
              "                writer.add_scalar(\"charts/episodic_return\", episode[\"r\"][idx], global_step)\n"
              "                writer.add_scalar(\"charts/episodic_length\", episode[\"l\"][idx], global_step)\n"
              "                break\n",
              "gymnasium >= 1.0's vector final_info is a dict of arrays: the same first finished episode logged"),
        Patch("sac_continuous_action_jax.py",
              "                real_next_obs[idx] = infos[\"final_observation\"][idx]\n",
              "                real_next_obs[idx] = infos[\"final_obs\"][idx]  "
              f"{MARK} gymnasium >= 1.0's name\n",
              "gymnasium >= 1.0 calls the final observation final_obs"),
    ),
    note="CleanRL's JAX SAC is not merged: this is pull request #519's head (refs/pull/519/head). A whole script "
         "(tyro arguments); its replay buffer (cleanrl_utils/buffers.py) is torch's, so it needs torch.",
)

PGX_ALPHAZERO = Reference(
    name="pgx_alphazero",
    mirror="pgx",
    url="https://github.com/sotetsuk/pgx",
    commit="079b2d730e3845c25d49d99e0ccf9a374dd04cb9",
    files={"examples/alphazero/train.py": "train.py", "examples/alphazero/network.py": "network.py",
           "examples/alphazero/requirements.txt": "requirements.txt"},
    patches=(
        Patch("train.py", 'baseline = pgx.make_baseline_model(config.env_id + "_v0")\n',
              f"baseline = None  {MARK} no download: evaluate's opponent\n"
              "# is uniform random over legal actions, unless train.baseline = pgx.make_baseline_model(ID) is set\n",
              "pgx.make_baseline_model downloads pretrained weights (Google Drive) at import, and exists only for "
              "animal_shogi, gardner_chess, go_9x9, hex and othello (any other env_id fails its assert): None, "
              "which evaluate below reads as a uniform random opponent over legal actions"),
        Patch("train.py", "        opp_logits, _ = baseline(state.observation)\n",
              f"        if baseline is None:  {MARK} uniform over legal actions\n"
              "            opp_logits = jnp.where(state.legal_action_mask, 0.0, jnp.finfo(jnp.float32).min)\n"
              "        else:\n"
              "            opp_logits, _ = baseline(state.observation)\n",
              "evaluate's opponent, when no pretrained baseline is set (the patch above): uniform random over legal "
              "actions (the pretrained baseline's logits, when set, are used unmasked, as written)"),
        Patch("train.py", "    model, opt_state = jax.device_put_replicated((model, opt_state), devices)\n",
              f"    {MARK} jax 0.10 removed device_put_replicated:\n"
              "    # the same copies, stacked along a new leading axis, one per device\n"
              "    sharding = jax.NamedSharding(jax.sharding.Mesh(devices, (\"i\",)), jax.P(\"i\"))\n"
              "    model, opt_state = jax.tree_util.tree_map(\n"
              "        lambda x: jax.device_put(jnp.stack([x] * num_devices), sharding), (model, opt_state)\n"
              "    )\n",
              "jax.device_put_replicated was removed in jax 0.10 (used in __main__ only): the same arrays with "
              "public APIs, as flax 0.12's jax_utils.replicate builds them (copies stacked along a new leading axis, "
              "sharded one per device; the sharding the pmapped functions return, so none is compiled twice)"),
    ),
    note="A script whose configuration is read from the command line at import (OmegaConf.from_cli() over "
         "sys.argv[1:], into its pydantic Config), which also builds env, forward and optimizer at import: set "
         "sys.argv = ['train.py', 'env_id=tic_tac_toe', ...] before `import train`. Its functions are jax.pmap'ed "
         "over jax.local_devices() (a leading device axis on every argument); the training loop is its __main__ "
         "block, which calls wandb.init and wandb.log: run it with WANDB_MODE=disabled.",
)

REFERENCES = (PUREJAXRL, PUREJAXQL, JAXMARL, CLEANRL, CLEANRL_SAC, PGX_ALPHAZERO)


class BuildError(Exception):
    """One reference could not be built; its message is one line."""


def git(mirror: str, *args: str) -> subprocess.CompletedProcess:
    """git in `mirror`, a bare repository or a clone (`git -C` finds either)."""
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", mirror, *args], capture_output=True)


def check_mirror(ref: Reference, mirror: str) -> None:
    if git(mirror, "rev-parse", "--git-dir").returncode:
        raise BuildError(f"{mirror} is not a git repository (a bare mirror or a clone)")
    if git(mirror, "cat-file", "-e", f"{ref.commit}^{{commit}}").returncode:
        fetch = f"git fetch {ref.url} {ref.ref}".rstrip()
        raise BuildError(f"commit {ref.commit} is not in {mirror}: fetch it ({fetch}) or give another mirror")


def read_files(ref: Reference, mirror: str) -> dict[str, str]:
    """The reference's files at its commit, keyed by their path under build/<name>/."""
    texts = {}
    for src, dest in ref.files.items():
        shown = git(mirror, "show", f"{ref.commit}:{src}")
        if shown.returncode:
            raise BuildError(f"{src} is not in commit {ref.commit}")
        texts[dest] = shown.stdout.decode()
    return texts


def apply_patches(ref: Reference, texts: dict[str, str]) -> None:
    for i, patch in enumerate(ref.patches, 1):
        count = texts[patch.file].count(patch.old)
        if count != 1:
            raise BuildError(f"patch {i} ({patch.file}: {patch.why}) expects its old text once at "
                             f"{ref.commit[:12]}, found it {count} times: upstream changed, review the patch")
        texts[patch.file] = texts[patch.file].replace(patch.old, patch.new)


def manifest(ref: Reference, mirror: str) -> dict:
    date = git(mirror, "show", "-s", "--format=%cI", ref.commit).stdout.decode().strip()
    return {"name": ref.name, "repo": ref.url, "ref": ref.ref, "commit": ref.commit, "commit_date": date,
            "files": ref.files, "patches": [{"file": p.file, "why": p.why} for p in ref.patches],
            "note": ref.note, "built_by": "bench/references/build.py"}


def build(ref: Reference, mirror: str, out: Path) -> Path:
    """Write build/<name>/ whole or not at all (a failed build leaves the previous one in place)."""
    check_mirror(ref, mirror)
    texts = read_files(ref, mirror)
    apply_patches(ref, texts)
    dest, partial = out / ref.name, out / f"{ref.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for rel, text in texts.items():
        (partial / rel).parent.mkdir(parents=True, exist_ok=True)
        (partial / rel).write_text(text)
    (partial / "REFERENCE.json").write_text(json.dumps(manifest(ref, mirror), indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return dest


def mirror_paths(args: argparse.Namespace) -> dict[str, str | None]:
    """Each option's mirror: the path given, else its default where that exists, else None (skipped)."""
    paths = {}
    for option, default in MIRRORS.items():
        given = getattr(args, option)
        paths[option] = given if given is not None else (default if Path(default).exists() else None)
    return paths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for option, default in MIRRORS.items():
        parser.add_argument(f"--{option}", metavar="PATH", help=f"git mirror or clone (default: {default})")
    parser.add_argument("--out", type=Path, default=HERE / "build", help="build folder (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = mirror_paths(args)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    for ref in REFERENCES:
        mirror = paths[ref.mirror]
        if mirror is None:
            print(f"{ref.name}: no mirror given (--{ref.mirror} PATH); its rows are skipped")
            continue
        try:
            dest = build(ref, mirror, args.out)
        except BuildError as error:
            print(f"{ref.name}: FAILED: {error}", file=sys.stderr)
            failed = True
            continue
        print(f"{ref.name}: {ref.commit[:12]} -> {dest} ({len(ref.files)} files, {len(ref.patches)} patches)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

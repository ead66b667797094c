"""Run by tests/test_distributed.py as
`fragc launch -n 2 -- python tests/two_process_resume.py DIR PPO_CONFIG_JSON POLICY...`.

For each policy, compiled with collective transfers and 2 iterations per
dispatch: train 4 iterations straight (noting where each dispatch ends), and 2
iterations that write a checkpoint, then resume from it on fresh state and train
the other 2, as `fragc run --resume` does (`Checkpointer.restore_latest`,
`place_state`, `place_delays`). Process 0 prints one JSON line per policy with
both parameter fingerprints, `prog.k` and the dispatch ends.
"""

import json
import os
import sys

from fragc import distributed
from fragc.launch import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

distributed.initialize(os.environ[ENV_COORDINATOR], int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID]),
                       local_devices=4)
distributed.keep_native_output_off_stdout()

import jax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import fragc  # noqa: E402
from fragc.actions import OnMetrics  # noqa: E402
from fragc.algos import make  # noqa: E402
from fragc.runtime.checkpoint import Checkpointer  # noqa: E402
from fragc.runtime.reporting import params_fingerprint  # noqa: E402


def resumed_and_straight(policy: str, folder: str, config: dict) -> dict:
    algo = make("ppo", **config)
    prog = fragc.compile(algo, policy, iterations_per_dispatch=2, transfers="collective")
    dispatch_ends = []
    straight, _ = prog.run(prog.init(0), 4, [OnMetrics(lambda done, metrics: dispatch_ends.append(done))])
    checkpointer = Checkpointer(os.path.join(folder, policy))
    meta = {"algo": "ppo", "policy": policy}

    class Save(fragc.actions.Action):
        every = 2

        def on_state(self, done, state, delays):
            if jax.process_index() == 0:
                checkpointer.save(done, state, delays, meta)

    prog.run(prog.init(0), 2, [Save()])
    multihost_utils.sync_global_devices(f"saved {policy}")  # process 1 reads what process 0 wrote
    fresh = prog.init(0)
    state, delays, saved = checkpointer.restore_latest(fresh, prog.initial_delays(fresh), run=meta)
    checkpointer.close()
    resumed, _ = prog.run(prog.place_state(state), 2, delays=prog.place_delays(delays) if delays else None)
    return {"policy": policy, "resumed_from": saved["iteration"], "straight": params_fingerprint(straight),
            "resumed": params_fingerprint(resumed), "processes": jax.process_count(), "devices": len(prog.devices),
            "k": prog.k, "dispatch_ends": dispatch_ends}


try:
    for name in sys.argv[3:]:
        result = resumed_and_straight(name, sys.argv[1], json.loads(sys.argv[2]))
        if jax.process_index() == 0:
            print(json.dumps(result), flush=True)
except BaseException as err:  # stop the other process at once, as `fragc run` does
    distributed.fail(f"{type(err).__name__}: {err}")
    raise
distributed.finish()

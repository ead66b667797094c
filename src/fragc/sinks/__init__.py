"""What a run writes besides its metric lines and checkpoints: the tracking sinks (TensorBoard, W&B, MLflow;
tracking.py), videos of a policy (video.py), and the statistics over seeds of a sweep's report (stats.py).

The sinks are periodic actions and functions over a `Program`'s results: they depend on the runtime (and the
algorithms' environments, to draw them), not on `fragc.compile` or the command line; `fragc.train` adds the
tracking sinks it is asked for, `fragc run --capture-video` a video capture.
"""

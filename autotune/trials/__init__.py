"""Real trials: a workload, how a plan is applied to it, and the subprocess that measures it."""

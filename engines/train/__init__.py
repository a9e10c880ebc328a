"""engines.train: DeepSpeed training steps: launch, worker ranks, warm server, step, publish."""

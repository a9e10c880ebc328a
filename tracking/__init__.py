"""Experiment tracking: each step's StepMetrics row and each evaluation, sent to the trackers a run
config turns on (section ``tracking``: TensorBoard, Weights & Biases offline, MLflow file store).

Trackers are I/O, so they live here and not in dapo_core; this package imports only schemas,
settings and storage, and the heavy tracker libraries lazily inside their adapter, so
``dapo --help`` stays light. The driver calls :class:`tracking.run_tracking.RunTracking` after
each step's metrics row is written and after each evaluation (workflows/driver.py).
"""

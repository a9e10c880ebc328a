"""engines.bootstrap: the step-0 policy: shipped, imported, or the tiny policy and its warm-up."""

"""engines.evaluate: evaluation sets and avg@k / pass@k / maj@k of a checkpoint."""

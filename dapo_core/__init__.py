"""dapo_core package."""

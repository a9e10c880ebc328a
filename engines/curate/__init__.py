"""engines.curate: raw problem sources into Problem shards (the curate stage's work)."""

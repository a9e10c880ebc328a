"""engines.score: reward verdicts (the verifier pool), filtering and group advantages."""

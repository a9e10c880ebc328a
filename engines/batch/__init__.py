"""engines.batch: a step's training batch assembled from the scored rounds."""

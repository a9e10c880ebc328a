"""One module per stage subcommand of `dapo` (curate, bootstrap, rollout, score, train, eval): parse, call the engine, print."""

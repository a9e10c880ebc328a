"""cli: every face of the `dapo` command (one module per subcommand); see docs/ARCHITECTURE.md."""

"""engines: see docs/ARCHITECTURE.md."""

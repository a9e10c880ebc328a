"""tasks package."""

"""Layout: layer contracts, the privacy boundary on the source, size limits."""

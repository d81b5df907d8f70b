"""The release path: charge before release, Ctrl-C, writes."""

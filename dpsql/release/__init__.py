"""The release path: what a request asked for, the Ctrl-C guard of a charged release, and the adaptive paths."""

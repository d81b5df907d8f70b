"""Engines: the one data-path operation (the data vector), called only by
:mod:`dpsql.kernel.data`."""

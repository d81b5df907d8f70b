"""The one Request value and the settings it is built from, each declared once.

- :mod:`dpsql.request.rules`: the value rules (epsilon, delta, a target, a strategy, a
  share, the planning limits, ...), one check per kind of value;
- :mod:`dpsql.request.setting`: the :class:`~dpsql.request.setting.Setting` type: its
  spelling per interface and its one parser, ``parse``;
- :mod:`dpsql.request.declared`: THE declaration, every setting exactly once
  (``SETTINGS``, ``CONNECTION_SETTINGS``), and how interfaces read it (``settings_for``,
  ``given``, ``check_asks``);
- :mod:`dpsql.request.value`: :class:`~dpsql.request.value.Request`, the frozen value of
  one request, and the rules between its fields.

Callers import from these modules; this package exposes nothing itself.
"""

"""The one release path (:mod:`.path`), the mechanism interface (:mod:`.mechanism`), the
mechanisms as the path runs them (:mod:`.matrix`, :mod:`.adaptive`), named releases asked
again (:mod:`.named`) and the Ctrl-C guard (:mod:`.support`)."""

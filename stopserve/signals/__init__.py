"""What an event's text shows, computed where the text is; never the text itself.

Importers, the client, the integrations and the hooks compute these from the text they
hold and put them on the event; the service and the featurizer read only the result.

* :mod:`stopserve.signals.progress`: progress signals (test-runner counts, exit codes, an
  error signature, files changed, an orchestrator's progress ledger) for an event's
  ``progress`` object;
* :mod:`stopserve.signals.sketch`: a similarity sketch of the text (``Event.sketch``):
  ``from stopserve.signals import sketch`` then ``sketch.sketch(text)``,
  ``sketch.similarity(sketch.parse(a), sketch.parse(b))``.

Nothing is imported here (a name bound in this package would hide the module of that
name), and the modules stay light: the ``stopserve hook`` process imports them (standard
library and orjson only, no numpy or pydantic).
"""

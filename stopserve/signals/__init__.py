"""What an event's text shows, computed where the text is; never the text itself.

* :mod:`stopserve.signals.progress`: progress signals (test-runner counts, exit codes, an
  error signature, files changed, an orchestrator's progress ledger) for an event's
  ``progress`` object;
* :mod:`stopserve.signals.sketch`: a similarity sketch of the text for an event's ``sketch``.

Importers, the client, the integrations and the hooks call them; the service and the
featurizer only read what they produced. Standard library (and orjson) only: the hook
command imports these modules.
"""

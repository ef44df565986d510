"""See what the service did: the HTML report (``stopserve report``) and the live page (``GET /ui``).

Data flows one way, as in the rest of the house::

    read.py       log files -> records (service decisions, traces, hook calls), every problem
                  as file:line: what; offsets kept, so the live page reads only what was appended
    summary.py    records -> Summary: a typed model of runs, stops, loops, costs, outcomes,
                  timelines, champion / challengers / promotions (one fold, O(1) per record)
    views.py      Summary -> one self-contained HTML page (Jinja2 + Plotly, the [report] extra)
    live.py       the live page's follower: a Summarizer fed by the appended bytes of the logs
    commands.py   ``stopserve report`` and ``stopserve hook report --html``

Nothing here imports FastAPI: ``stopserve.service.routes.ui`` adapts the live page to HTTP.
"""

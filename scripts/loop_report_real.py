"""How often the default loop detector fires on imported real runs, and how often it cuts a run that
later succeeded: ``python scripts/loop_report_real.py swe.jsonl mint.jsonl intercode.jsonl``."""

import sys, collections
from stopserve.safety import SafetyConfig
from stopserve.trace import read_traces

cfg = SafetyConfig.from_dict(
    {"quality_met": None, "max_turns": None, "max_seconds": None}
)  # the loop rule alone
for path in sys.argv[1:]:
    n = fired = fired_succ = 0
    pat = collections.Counter()
    pat_succ = collections.Counter()
    for tr in read_traces([path]):
        n += 1
        r = cfg.first_stop(tr.model_copy(update={"budget": None}))
        if r is None:
            continue
        turn, idx, stop = r
        fired += 1
        pat[stop.pattern] += 1
        # success and the stop came before the last event
        if tr.rewards.get("team", 0) >= 1 and idx < len(tr.events) - 2:
            fired_succ += 1
            pat_succ[stop.pattern] += 1
    print(path, n, "loop fired", fired, dict(pat), "on successful runs", fired_succ, dict(pat_succ))

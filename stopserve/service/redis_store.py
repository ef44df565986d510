"""The shared run store on Redis: several replicas (or ``--workers``) serve the same runs.

``STOPSERVE_STORE=redis://host:port/db``. Each run is one Redis hash (one key, so one TTL, and
Redis's memory policy evicts a run whole, never half of it), named with the run id as a
cluster hash tag so its keys share a slot:

=========================  ==============================================================
``stopserve:{id}:run``     hash: ``v`` version, ``s`` the run record (MessagePack: settings,
                           counters, the last answer, ``RunState.to_bytes()``), ``e:<n>``
                           event n's JSON, ``i:<event id>`` a folded id, ``d:<k>`` decision k
                           of the journal as ``<event index>:<JSON>``
``stopserve:{id}:seen``    when the run was last used (ms); outlives the run by
                           ``keep_s``, so an expired or evicted run is refused (409
                           ``run_evicted``), never started over
``stopserve:{id}:closed``  the run's outcome was posted (409 ``run_closed``), for ``keep_s``
=========================  ==============================================================

Concurrency is optimistic, checked on the server: a call reads the run in one round trip
(a Lua script: the record and which of the request's event ids are folded, TTLs refreshed),
folds and decides in Python (the one featurizer, the model), and writes back in one round
trip with a Lua script that applies the change only if the version is still the one read
(compare-and-set). Another replica's write in between makes it return 0, and the engine
starts the call over from the read: the events it folded meanwhile are then seen ids,
skipped. Lua rather than WATCH/MULTI: a WATCH holds one connection per call in flight from
the read to the write and costs a third round trip; a script needs neither, and the
retried read is the same one-round-trip read.

The redis package is imported when this store is opened (the ``[redis]`` extra).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgpack
import orjson

from stopserve.features import RunState
from stopserve.service.store import (
    Closed,
    Evicted,
    Found,
    Run,
    StoreUnavailableError,
)
from stopserve.trace import Budget

__all__ = ["RECORD_VERSION", "RedisRunStore", "redacted"]

_log = logging.getLogger("stopserve.service")

#: Version of the run record (``s``); a record of another version is refused as evicted.
RECORD_VERSION: Final = 1
#: Runs finished by every replica (``INCR`` per outcome): what ``STOPSERVE_RETRAIN_EVERY`` counts.
OUTCOMES_KEY: Final = "stopserve:outcomes"
#: Values per HSET inside the scripts (Lua's unpack has a limit near 8,000).
_CHUNK: Final = 1000
#: How often the live-run count and Redis's memory are read for /metrics (seconds).
_GAUGE_PERIOD_S: Final = 30.0
#: Connections of a process's asyncio pool; a call past them waits for one to come free.
_ASYNC_CONNECTIONS: Final = 100

# KEYS: run, seen, closed. ARGV: ttl ms, keep ms, whole (0/1), event ids...
# -> {"closed"} | {"gone", last used ms, now ms} | {"none"} | {"ok", v, s, folded flags... | all fields}
_READ = """
if redis.call('EXISTS', KEYS[3]) == 1 then return {'closed'} end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local head = redis.call('HMGET', KEYS[1], 'v', 's')
if not head[1] then
  local seen = redis.call('GET', KEYS[2])
  if seen then return {'gone', seen, tostring(now)} end
  return {'none'}
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], tostring(now), 'PX', ARGV[2])
local out = {'ok', head[1], head[2]}
if ARGV[3] == '1' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do out[#out + 1] = all[i] end
  return out
end
for i = 4, #ARGV, 1000 do
  local fields = {}
  for j = i, math.min(i + 999, #ARGV) do fields[#fields + 1] = 'i:' .. ARGV[j] end
  local got = redis.call('HMGET', KEYS[1], unpack(fields))
  for j = 1, #fields do out[#out + 1] = got[j] and '1' or '0' end
end
return out
"""

# KEYS: run, seen, closed. ARGV: expected version (0: create), ttl ms, keep ms, record, field, value...
# -> the new version, or 0 when the run changed (or was created, closed, dropped) since it was read
_SAVE = """
local v = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == '0' then
  if v or redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
elseif v ~= ARGV[1] then
  return 0
end
local nv = tonumber(ARGV[1]) + 1
redis.call('HSET', KEYS[1], 'v', nv, 's', ARGV[4])
for i = 5, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
redis.call('SET', KEYS[2], tostring(t[1] * 1000 + math.floor(t[2] / 1000)), 'PX', ARGV[3])
return nv
"""

# KEYS: run, seen, closed. ARGV: expected version, keep ms. -> 1 closed, 0 changed since read
_CLOSE = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
return 1
"""

# KEYS: run, seen, closed. ARGV: version, ttl ms, keep ms, record, field, value... -> 1 reopened
_REOPEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 's', ARGV[4])
for i = 5, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
redis.call('SET', KEYS[2], tostring(t[1] * 1000 + math.floor(t[2] / 1000)), 'PX', ARGV[3])
return 1
"""


def redacted(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisRunStore:
    """:class:`~stopserve.service.store.RunStore` on Redis, shared by every replica using ``url``.

    ``ttl_s``: a run idle this long expires (Redis TTL); ``keep_s``: how long an expired,
    evicted or closed run is remembered as such. ``load_safety`` turns a stored safety
    config back into the object the policy reads (the engine's cached parser).
    The blocking methods (thread pool routes) and the ``a``-prefixed ones (event loop)
    share everything but the client call.
    """

    shared = True

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        keep_s: float,
        load_safety: Callable[[dict[str, Any]], Any],
        timeout_s: float = 5.0,
    ) -> None:
        import redis  # open_store checked that the [redis] extra is installed
        import redis.asyncio
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        self.url = url
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.keep_ms = max(self.ttl_ms, round(keep_s * 1000))
        self._load_safety = load_safety
        self._errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)
        options: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "health_check_interval": 30,
        }
        retry = (redis.ConnectionError, redis.TimeoutError)
        # a lost connection (Redis restarted) is tried again; a script re-run after a lost
        # answer is harmless: its version check fails and the call starts over from the read
        self._sync = redis.Redis.from_url(
            url, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3), retry_on_error=list(retry), **options
        )
        self._async_options = {
            "retry": redis.asyncio.retry.Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
            "retry_on_error": list(retry),
            **options,
        }
        self._async_client: Callable[..., Any] = _blocking_client
        self._async: Any = None
        self._scripts = {name: self._sync.register_script(src) for name, src in _SCRIPTS.items()}
        self._ascripts: dict[str, Any] = {}
        self._live = 0
        self._bytes = 0
        self._gauges_at = -_GAUGE_PERIOD_S

    # ------------------------------------------------------------------ the interface

    def now(self) -> float:
        return time.time()  # shared by processes: wall clock, not monotonic

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return self._live

    def get(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        ids = list(ids)
        reply = self._call("read", run_id, [self.ttl_ms, self.keep_ms, int(whole), *ids])
        return self._found(run_id, ids, reply, whole)

    async def aget(self, run_id: str, ids: Collection[str] = (), *, whole: bool = False) -> Found:
        ids = list(ids)
        reply = await self._acall("read", run_id, [self.ttl_ms, self.keep_ms, int(whole), *ids])
        return self._found(run_id, ids, reply, whole)

    def add(self, run: Run) -> None:
        run.version = 0  # stored by its first save

    def charge(self, run: Run, nbytes: int) -> None:
        run.nbytes = nbytes  # the byte cap per run holds; Redis's maxmemory bounds the total

    def save(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        args = self._save_args(run, record)
        return self._saved(run, self._call("save", run.run_id, args))

    async def asave(self, run: Run, record: dict[str, Any] | None = None) -> bool:
        args = self._save_args(run, record)
        return self._saved(run, await self._acall("save", run.run_id, args))

    def close(self, run: Run) -> bool:
        done = bool(self._call("close", run.run_id, [run.version, self.keep_ms]))
        run.closed = done
        return done

    def reopen(self, run: Run) -> None:
        fields = self._fields(run, whole=True)
        args = [run.version, self.ttl_ms, self.keep_ms, self._record(run, None), *fields]
        self._call("reopen", run.run_id, args)
        run.closed = False

    def pop(self, run_id: str) -> None:
        self._command(lambda: self._sync.delete(*_keys(run_id)[:2]))

    def forget(self, run_id: str) -> None:
        self._command(lambda: self._sync.delete(_keys(run_id)[1]))

    def count_outcome(self) -> int:
        return int(self._command(lambda: self._sync.incr(OUTCOMES_KEY)))

    def sweep(self) -> int:
        """Redis expires runs itself; this refreshes the gauges now and then (SCAN, INFO)."""
        now = time.monotonic()
        if now - self._gauges_at >= _GAUGE_PERIOD_S:
            self._gauges_at = now

            def gauges() -> tuple[int, int]:
                live = sum(1 for _ in self._sync.scan_iter(match="stopserve:*:run", count=1000))
                memory = int(self._sync.info("memory").get("used_memory", 0))
                return live, memory

            self._live, self._bytes = self._command(gauges)
        return 0

    def ping(self) -> None:
        self._command(self._sync.ping)

    def close_store(self) -> None:
        self._sync.close()

    async def aclose_store(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    # ------------------------------------------------------------------ transport

    def _call(self, script: str, run_id: str, args: Sequence[Any]) -> Any:
        return self._command(lambda: self._scripts[script](keys=_keys(run_id), args=args))

    async def _acall(self, script: str, run_id: str, args: Sequence[Any]) -> Any:
        if self._async is None:
            self._async = self._async_client(self.url, **self._async_options)
            self._ascripts = {name: self._async.register_script(src) for name, src in _SCRIPTS.items()}
        try:
            return await self._ascripts[script](keys=_keys(run_id), args=args)
        except self._errors as exc:
            raise self._unavailable(exc) from None

    def _command(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._errors as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: Exception) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"the run store at {redacted(self.url)} cannot be reached: {type(exc).__name__}: {exc}"
        )

    # ------------------------------------------------------------------ encoding (shared by both)

    def _found(self, run_id: str, ids: list[str], reply: list[Any], whole: bool) -> Found:
        kind = reply[0]
        if kind == b"closed":
            return Closed(run_id)
        if kind == b"none":
            return None
        if kind == b"gone":
            last, now = int(reply[1]), int(reply[2])
            # idle past the TTL: expired; used more recently: Redis evicted it (maxmemory)
            if now - last >= self.ttl_ms - 50:
                why = "idle past its ttl (STOPSERVE_RUN_TTL_S)"
                return Evicted(run_id, "ttl", last / 1000, why)
            why = "evicted by Redis under its maxmemory policy before its ttl (give Redis more memory)"
            return Evicted(run_id, "bytes", last / 1000, why)
        version, blob = int(reply[1]), reply[2]
        try:
            run = self._decode(run_id, blob)
            if whole:
                _load_whole(run, reply[3:])
        except (ValueError, KeyError, TypeError) as exc:
            # written by another stopserve version, or damaged: refused as dropped, never started over
            _log.error("run %r: its stored record cannot be read (%s): refused as evicted", run_id, exc)
            why = "its stored record cannot be read by this stopserve version (written by another?)"
            return Evicted(run_id, "bytes", time.time(), why)
        run.version = version
        if not whole:
            run.first_event = run.n_events
            run.event_ids = {eid for eid, flag in zip(ids, reply[3:], strict=True) if flag == b"1"}
        return run

    def _decode(self, run_id: str, blob: bytes) -> Run:
        try:
            doc = msgpack.unpackb(blob)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"run {run_id!r}: unreadable run record: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != RECORD_VERSION:
            raise ValueError(f"run {run_id!r}: run record of another version")
        safety = doc["safety"]
        budget = doc["budget"]
        run = Run(
            run_id=run_id,
            task_id=doc["task_id"],
            state=RunState.from_bytes(doc["state"]),
            created_at=doc["created_at"],
            last_seen_at=time.time(),
            topology=doc["topology"],
            system=doc["system"],
            budget=Budget.model_validate(budget) if budget is not None else None,
            lam=doc["lam"],
            cost_share=doc["cost_share"],
            safety=self._load_safety(safety) if safety is not None else None,
            n_events=doc["n_events"],
            last_t=doc["last_t"],
            n_decisions=doc["n_decisions"],
            last_response=doc["last_response"],
            last_proposed=doc["last_proposed"],
            last_event_id=doc["last_event_id"],
            nbytes=doc["nbytes"],
            last_record=doc["record"],
            explored=doc.get("explored", False),
            shadow=doc.get("shadow") or {},
            shadow_done=doc.get("shadow_done", False),
        )
        run.first_decision = doc["n_journal"]
        return run

    def _record(self, run: Run, record: dict[str, Any] | None) -> bytes:
        doc = {
            "format": RECORD_VERSION,
            "task_id": run.task_id,
            "topology": run.topology,
            "system": run.system,
            "budget": run.budget.model_dump(exclude_none=True, mode="json") if run.budget else None,
            "lam": run.lam,
            "cost_share": run.cost_share,
            "safety": run.safety.to_dict() if run.safety is not None else None,
            "created_at": run.created_at,
            "n_events": run.n_events,
            "n_journal": run.n_journal,
            "last_t": run.last_t,
            "n_decisions": run.n_decisions,
            "last_response": run.last_response,
            "last_proposed": run.last_proposed,
            "last_event_id": run.last_event_id,
            "nbytes": run.nbytes,
            "record": record if record is not None else run.last_record,
            "explored": run.explored,
            "shadow": run.shadow,
            "shadow_done": run.shadow_done,
            "state": run.state.to_bytes(),
        }
        return bytes(msgpack.packb(doc))

    def _fields(self, run: Run, *, whole: bool = False) -> list[str]:
        """The hash fields this call adds (``whole``: all of the run's), flat: field, value, ..."""
        out: list[str] = []
        for n, text in enumerate(run.events, start=run.first_event):
            out += (f"e:{n}", text)
        ids = run.event_ids if whole else _new_ids(run)
        for eid in ids:
            out += (f"i:{eid}", "1")
        for k, (at, text) in enumerate(run.decisions, start=run.first_decision):
            out += (f"d:{k}", f"{at}:{text}")
        return out

    def _save_args(self, run: Run, record: dict[str, Any] | None) -> list[Any]:
        return [run.version, self.ttl_ms, self.keep_ms, self._record(run, record), *self._fields(run)]

    @staticmethod
    def _saved(run: Run, reply: Any) -> bool:
        version = int(reply)
        if not version:
            return False
        run.version = version
        # what was saved is in the store now: the next save of this copy adds only what follows
        run.first_event = run.n_events
        run.first_decision = run.n_journal
        run.events.clear()
        run.decisions.clear()
        return True


_SCRIPTS: Final = {"read": _READ, "save": _SAVE, "close": _CLOSE, "reopen": _REOPEN}


def _blocking_client(url: str, **options: Any) -> Any:
    """An asyncio client whose pool makes a call wait for a free connection, not fail.

    A batch decides its runs concurrently, more of them than the pool holds; redis-py's plain
    pool refuses the call past its size ("Too many connections"). The wait is bounded by the
    socket timeout, after which the run store is reported unavailable as for any other error.
    """
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=_ASYNC_CONNECTIONS, timeout=options.get("socket_timeout") or 20.0, **options
    )
    return redis.asyncio.Redis.from_pool(pool)


def _keys(run_id: str) -> list[str]:
    tag = "stopserve:{" + run_id + "}"
    return [tag + ":run", tag + ":seen", tag + ":closed"]


def _new_ids(run: Run) -> list[str]:
    """Ids of the events this call added (their JSON's ``id``), in order."""
    return [orjson.loads(text)["id"] for text in run.events]


def _load_whole(run: Run, flat: list[bytes]) -> None:
    """Fill a run's journal from all of its hash fields (HGETALL, flat)."""
    events: dict[int, str] = {}
    decisions: dict[int, tuple[int, str]] = {}
    ids: set[str] = set()
    for i in range(0, len(flat), 2):
        name = flat[i].decode()
        kind, _, key = name.partition(":")
        if not key:
            continue  # v, s: read already
        value = flat[i + 1].decode()
        if kind == "e":
            events[int(key)] = value
        elif kind == "i":
            ids.add(key)
        elif kind == "d":
            at, _, text = value.partition(":")
            decisions[int(key)] = (int(at), text)
    run.events = [events[n] for n in range(run.n_events)]
    run.decisions = [decisions[k] for k in range(run.first_decision)]
    run.event_ids = ids
    run.first_event = 0
    run.first_decision = 0

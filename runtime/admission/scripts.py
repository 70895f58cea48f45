"""The per-request Lua scripts of :class:`~.redis_limits.RedisLimits` (admit, settle, renew).

Each runs atomically in Redis; see :mod:`.redis_limits` for the keys and :mod:`.limits` for
the semantics. The allowance scripts (grant, return) are in :mod:`.allowance`.
"""

from __future__ import annotations

# KEYS: rpm, tpm, conc, credit, escrow. ARGV: lease id, rpm, tpm, concurrency, tokens,
# lease ms, window ms, then the credit ask: need µc, day field, month field, day cap, month
# cap (-1: none), overdraft ("1": admit without escrow when short).
# Returns {status, retry_ms, detail, available µc, budget room µc (-1: no cap), held µc,
# requests in the window, tokens in the bucket (floor), ms until the window is back to full}
# (the last three after this admission when admitted, for the x-ratelimit-* headers):
# status "ok" | "overdraft" | "rpm" | "tpm" | "concurrency" | "credits" | "budget".
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local debit, lease, window = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local need = tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local used = redis.call('ZCARD', KEYS[1])
local b = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then tokens, ts = tpm, now end
tokens = math.min(tpm, tokens + math.max(0, now - ts) * tpm / window)
local function refused(status, retry, detail)
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local reset = newest[2] and math.max(0, tonumber(newest[2]) + window - now) or 0
  return {status, retry, detail, 0, -1, 0, used, math.floor(tokens), reset}
end
if used >= rpm then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return refused('rpm', math.max(1, tonumber(oldest[2]) + window - now), used)
end
local want = math.min(debit, tpm)
if tokens < want then
  local wait = math.max(1, math.ceil((want - tokens) * window / tpm))
  return refused('tpm', wait, math.floor(tokens))
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, lid in ipairs(dead) do
  local amount = redis.call('HGET', KEYS[5], lid)
  if amount then
    redis.call('HDEL', KEYS[5], lid)
    redis.call('HINCRBY', KEYS[4], 'escrow', -tonumber(amount))
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local held = redis.call('ZCARD', KEYS[3])
if held >= conc then
  return refused('concurrency', 1000, held)
end
local status, hold, avail, room, capped = 'ok', 0, 0, 0, false
if need > 0 then
  local c = redis.call('HMGET', KEYS[4], 'balance', 'escrow', ARGV[9], ARGV[10])
  local escrow = tonumber(c[2]) or 0
  avail = (tonumber(c[1]) or 0) - escrow
  local caps = {{tonumber(ARGV[11]), tonumber(c[3]) or 0},
                {tonumber(ARGV[12]), tonumber(c[4]) or 0}}
  for _, cap in ipairs(caps) do
    if cap[1] >= 0 then
      local left = cap[1] - cap[2] - escrow
      if not capped or left < room then room = left end
      capped = true
    end
  end
  if capped and room < need then
    local r = refused('budget', 0, need)
    r[4], r[5] = avail, math.max(0, room)
    return r
  end
  if avail < need then
    if ARGV[13] ~= '1' then
      local r = refused('credits', 0, need)
      r[4], r[5] = avail, capped and room or -1
      return r
    end
    status = 'overdraft'
  else
    hold = need
  end
end
redis.call('ZADD', KEYS[1], now, id)
redis.call('PEXPIRE', KEYS[1], window + 1000)
local left = tokens - debit
redis.call('HSET', KEYS[2], 'tokens', tostring(left), 'ts', now)
redis.call('PEXPIRE', KEYS[2], math.ceil((tpm - left) * window / tpm) + window)
redis.call('ZADD', KEYS[3], now + lease, id)
redis.call('PEXPIRE', KEYS[3], lease * 2)
if hold > 0 then
  redis.call('HSET', KEYS[5], id, hold)
  redis.call('HINCRBY', KEYS[4], 'escrow', hold)
  avail = avail - hold
  room = room - hold
end
return {status, 0, 0, avail, capped and math.max(0, room) or -1, hold, used + 1,
        math.floor(left), window}
"""

# One call settles one or more settlements (one flush is one call: issue #27); called with one,
# it is the per-settlement script it always was.
# KEYS: rpm, tpm, conc, credit, escrow (the first settlement's tenant: block 1), usage stream,
# done marker of settlement 1, done markers of settlements 2..n, then the 5 keys of each
# further tenant (blocks 2, 3, ...). ARGV: lease id, tokens to credit back, "1" to drop the
# RPM entry, cost µc, day field, month field, usage event ("" for none), done TTL s (all of
# settlement 1; the day and month fields and the TTL are every settlement's), then 6 per
# further settlement: its tenant's block, lease id, tokens back, drop RPM, cost µc, event.
# Per settlement: charges min(cost, available after releasing this lease's escrow), so a
# balance never goes negative (unless Redis lost the balance: then the full cost, and the
# reconciliation re-bases it on the ledger); appends the event with the amount charged. A
# lease settled before (a spool replay) changes nothing. Each settlement is applied in turn,
# exactly as if it were called alone. Returns the µc charged per settlement, in order (-1: a
# replay).
SETTLE_LUA = """
local n = (#ARGV - 8) / 6 + 1
local function malformed()
  return redis.error_reply('ERR settle: malformed keys or arguments (see SETTLE_LUA)')
end
if #ARGV < 8 or n % 1 ~= 0 or #KEYS < 6 + n or (#KEYS - 6 - n) % 5 ~= 0 then
  return malformed()
end
local blocks = (#KEYS - 6 - n) / 5 + 1
for i = 2, n do
  local b = tonumber(ARGV[8 + (i - 2) * 6 + 1])
  if b == nil or b < 1 or b > blocks or b % 1 ~= 0 then return malformed() end
end
local day, month, ttl = ARGV[5], ARGV[6], tonumber(ARGV[8])
local function settle(k, done, lease, refund, drop, cost, event)
  if redis.call('SET', done, '1', 'NX', 'EX', ttl) == false then return -1 end
  redis.call('ZREM', KEYS[k + 3], lease)
  if drop == '1' then redis.call('ZREM', KEYS[k + 1], lease) end
  refund = tonumber(refund)
  if refund ~= 0 and redis.call('EXISTS', KEYS[k + 2]) == 1 then
    redis.call('HINCRBYFLOAT', KEYS[k + 2], 'tokens', refund)
  end
  local credit = KEYS[k + 4]
  local held = tonumber(redis.call('HGET', KEYS[k + 5], lease) or '0')
  if held > 0 then
    redis.call('HDEL', KEYS[k + 5], lease)
    redis.call('HINCRBY', credit, 'escrow', -held)
  end
  local charge = 0
  cost = tonumber(cost)
  if cost > 0 then
    local c = redis.call('HMGET', credit, 'balance', 'escrow')
    if c[1] == false then
      charge = cost  -- a Redis that lost the balance: charge in full; reconciliation re-bases it
    else
      charge = math.max(0, math.min(cost, tonumber(c[1]) - (tonumber(c[2]) or 0)))
    end
    if charge > 0 then
      redis.call('HINCRBY', credit, 'balance', -charge)
      redis.call('HINCRBY', credit, day, charge)
      redis.call('HINCRBY', credit, month, charge)
    end
  end
  if event ~= '' then
    redis.call('XADD', KEYS[6], '*', 'event', event, 'charged', charge)
  end
  return charge
end
local charged = {settle(0, KEYS[7], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[7])}
for i = 2, n do
  local a = 8 + (i - 2) * 6
  local b = tonumber(ARGV[a + 1])
  local k = b == 1 and 0 or 6 + n + (b - 2) * 5
  charged[i] = settle(k, KEYS[6 + i], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
                      ARGV[a + 6])
end
return charged
"""

# KEYS: conc. ARGV: lease ms, then lease ids. Pushes the expiry of leases still held.
RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], lease * 2)
return #ARGV - 1
"""

__all__ = ["ADMIT_LUA", "RENEW_LUA", "SETTLE_LUA"]

"""The Redis store's Lua scripts: each is one atomic step on one session's
keys (one slot: ``redis_keys``), run by ``redis.RedisStore``. Above each: its
KEYS and ARGV, in order.
"""

from __future__ import annotations

# KEYS: record, history. ARGV: agent, created, activity, metadata, n, owner,
# the pause ('' for none), the webhook URL ('' for none), messages...
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'agent_name', ARGV[1], 'created_at', ARGV[2],
           'last_activity', ARGV[3], 'metadata', ARGV[4], 'message_count', ARGV[5],
           'owner', ARGV[6])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'pause', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'webhook_url', ARGV[8]) end
for i = 9, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
"""

# KEYS: record, history, events, turn index, turn status, the turn set of
# before the index (unused: a delete reads it), checkpoint. ARGV: activity,
# ttl, final event or '', turn, fence or '', pause op ('keep' or 'set'), the
# pause ('' clears it), now (the clock the index is trimmed by), turns indexed
# at most, checkpoint op ('keep' or 'set'), the checkpoint ('' clears it),
# messages...
# 0: no session; 2: void (another server owns the session now, or the turn
# was given up for lost); 1: committed.
COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'owner') ~= ARGV[5] then return 2 end
if ARGV[3] ~= '' then
  if redis.call('GET', KEYS[5]) == 'abandoned' then return 2 end
  redis.call('SET', KEYS[5], 'committed', 'EX', ARGV[2])
end
for i = 12, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('HINCRBY', KEYS[1], 'message_count', #ARGV - 11)
redis.call('HSET', KEYS[1], 'last_activity', ARGV[1])
if ARGV[6] == 'set' then
  if ARGV[7] == '' then redis.call('HDEL', KEYS[1], 'pause')
  else redis.call('HSET', KEYS[1], 'pause', ARGV[7]) end
end
if ARGV[10] == 'set' then
  if ARGV[11] == '' then redis.call('DEL', KEYS[7])
  else redis.call('SET', KEYS[7], ARGV[11]) end
end
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], ARGV[8], ARGV[4])
  -- Entries past the window name keys expired by now; past the bound, keys
  -- that expire on their own within it.
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (tonumber(ARGV[8]) - tonumber(ARGV[2])))
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -tonumber(ARGV[9]) - 1)
end
return 1
"""

# KEYS: idempotency keys, their times. ARGV: key, turn, now, window, most
# kept. Keys written by a server of before the times count from now (kept
# one more window, never less); then those past the window or the bound go.
SET_KEY = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if redis.call('HLEN', KEYS[1]) > redis.call('ZCARD', KEYS[2]) then
  -- Just older than the key written now: past the bound they go first.
  local before = tonumber(ARGV[3]) - 0.001
  for _, key in ipairs(redis.call('HKEYS', KEYS[1])) do
    redis.call('ZADD', KEYS[2], 'NX', before, key)
  end
end
local since = '(' .. (tonumber(ARGV[3]) - tonumber(ARGV[4]))
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', since)
local over = redis.call('ZCARD', KEYS[2]) - #old - tonumber(ARGV[5])
if over > 0 then
  for _, key in ipairs(redis.call('ZRANGE', KEYS[2], #old, #old + over - 1)) do
    table.insert(old, key)
  end
end
for i = 1, #old, 500 do
  local part = {unpack(old, i, math.min(i + 499, #old))}
  redis.call('HDEL', KEYS[1], unpack(part))
  redis.call('ZREM', KEYS[2], unpack(part))
end
return #old
"""

# KEYS: turn status. ARGV: ttl. 1: abandoned (now or before), 0: committed.
ABANDON = """
local status = redis.call('GET', KEYS[1])
if status == 'committed' then return 0 end
redis.call('SET', KEYS[1], 'abandoned', 'EX', ARGV[1])
return 1
"""

# KEYS: record. ARGV: the owner expected, the new owner. 1: swapped; 0: the
# owner was not the one expected; -1: no session.
SWAP_OWNER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local owner = redis.call('HGET', KEYS[1], 'owner') or ''
if owner ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[2])
return 1
"""

# KEYS: record, turn record, turn records. ARGV: the turn record, ended ('1'
# or '0'), ttl, turn, now (ms). -1: no session; 0: not written (it says the
# turn ended already, which is final); else the session's turn records.
PUT_TURN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'ended') == '1' then return 0 end
redis.call('HSET', KEYS[2], 'turn', ARGV[1], 'ended', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return redis.call('ZCARD', KEYS[3])
"""

# KEYS: record. ARGV: activity. Touches only a session that exists.
TOUCH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'last_activity', ARGV[1])
return 1
"""

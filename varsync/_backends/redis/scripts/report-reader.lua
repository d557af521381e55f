-- KEYS: the reader's entry, the table's index. ARGV: the head, the reader's index member
-- (its encoded id), record, ttl (ms). The head is read from ARGV, not declared: a
-- script's declared keys need write permission, and an actor may only read the head.
if redis.call('EXISTS', ARGV[1]) == 0 then return {NO_TABLE} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[3], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
-- the index lives as long as its longest-lived entry, and a second more
if redis.call('PTTL', KEYS[2]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[2], ttl + 1000) end
return {REPORTED}

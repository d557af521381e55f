-- KEYS: head. ARGV: epoch the writer knows, the push's layout, chunk key prefix, the
-- push's token, TTL (ms) of an unpublished push's chunks.
-- Hands the spare version's chunks to a push (renamed to its chunk keys) when they have
-- exactly the push's layout. Otherwise the spare is dropped (its chunks deleted, unless
-- they are a readable version's).
-- Every key it changes is read before the first change (see the publish script).
local h = redis.call('HMGET', KEYS[1], 'epoch', 'spare', 'data', 'retained', 'segments')
if not h[1] or h[1] ~= ARGV[1] or not h[2] or h[2] == '' then return {NO_SPARE} end
local token, layout = string.match(h[2], '^(%x+):(%d+:%d+:%d+)$')
if not token then
  redis.call('HSET', KEYS[1], 'spare', '')
  return {SPARE_DROPPED}
end
-- never the chunks of a segment still readable (only a damaged head could say so)
if token == h[3] or string.find(',' .. (h[4] or ''), ',' .. token .. ':', 1, true) or
   string.find(h[5] or '', ':' .. token .. ':', 1, true) then
  redis.call('HSET', KEYS[1], 'spare', '')
  return {SPARE_DROPPED}
end
local count = tonumber(string.match(layout, ':(%d+)$'))
local old = ARGV[3] .. token .. ':'
local new = ARGV[3] .. ARGV[4] .. ':'
local usable = layout == ARGV[2]
for i = 0, count - 1 do
  if redis.call('EXISTS', old .. i) == 0 then usable = false end
  if usable then redis.call('EXISTS', new .. i) end
end
redis.call('HSET', KEYS[1], 'spare', '')
if not usable then
  for i = 0, count - 1 do redis.call('UNLINK', old .. i) end
  return {SPARE_DROPPED}
end
for i = 0, count - 1 do
  redis.call('RENAME', old .. i, new .. i)
  redis.call('PEXPIRE', new .. i, ARGV[5])
end
return {CLAIMED, count}

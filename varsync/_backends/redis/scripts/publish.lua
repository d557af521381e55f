-- KEYS: head, events. ARGV: epoch the writer knows, token, layout, chunk count, keep,
-- chunk key prefix, last version this writer published, a fresh epoch, stream length,
-- chunk header size, '1' to keep the oldest retired segment as the spare, the tokens
-- of the versions this writer published or may have published (comma-separated), the
-- table's leaf count, '' for a whole write or '+' and the leaves it holds as
-- 'index.offset' (comma-separated, offsets into its bytes), '' or the base version,
-- '' or the element patches it holds as 'index.offset.length' (comma-separated; each
-- becomes a link of its leaf's chain, on a base only).
-- Every check comes before the first change, so a refusal leaves the table as it was;
-- and every key it changes is read before the first change, so that in a Redis Cluster
-- a slot in migration (a key of it gone to the target node) stops it there, unchanged.
local h = redis.call('HMGET', KEYS[1], 'epoch', 'version', 'data', 'retained', 'layout', 'spare',
                     'run', 'fmt', 'leaves', 'segments')
local partial = ARGV[14] ~= ''
if not h[1] then
  if partial then return {NO_BASE, 'vanished'} end
  return {VANISHED}
end
local based = partial and ARGV[15] ~= ''
local patches = ARGV[16] or ''  -- absent: none (an argument list of before patches)
if patches ~= '' and not based then return {NO_BASE, 'patches without a base'} end
if h[1] ~= ARGV[1] then
  if based then return {NO_BASE, 'another history'} end
  return {OTHER_EPOCH, h[1]}
end
-- digits only, below 2^53: Lua numbers are doubles, exact up to there
if not string.match(h[2] or '', '^%d+$') then return {MALFORMED_HEAD, 'version'} end
local version = tonumber(h[2])
if version >= 9007199254740992 then return {MALFORMED_HEAD, 'version'} end
local before = h[2]
if partial then
  if ARGV[15] ~= '' and ARGV[15] ~= before then return {BASE_MOVED, before} end
  if version == 0 or not h[3] or h[3] == '' then return {NO_BASE, 'empty'} end
end
local epoch = h[1]
local published = tonumber(ARGV[7])
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)  -- plain: a pattern tried at every byte cost more
local run = at and string.match(info, '^%x+', at + 7) or ''
if version < published then
  -- the version went back (an older snapshot came back): start a new history
  epoch = ARGV[8]
  version = published
elseif version > 0 and h[7] ~= run and h[3] and
       not string.find(',' .. ARGV[12] .. ',', ',' .. h[3] .. ',', 1, true) then
  -- the server restarted since this version was published, perhaps from an older
  -- snapshot, and this writer cannot vouch for it: its number may have named another
  -- value before the restart, so start a new history
  epoch = ARGV[8]
end
-- leaves on a base are composed only in the history the writer knows; without a base
-- on whatever is current: its leaf versions stay below every version of the new history
if based and epoch ~= h[1] then return {NO_BASE, 'new history'} end
version = version + 1
local now = string.format('%d', version)
local chunks = tonumber(ARGV[4])
local data = ARGV[6] .. ARGV[2] .. ':'
local total, payload = string.match(ARGV[3], '^(%d+):(%d+):')
local header = tonumber(ARGV[10])
for i = 0, chunks - 1 do
  local size = header + tonumber(payload)
  if i == chunks - 1 then size = header + tonumber(total) - tonumber(payload) * (chunks - 1) end
  if redis.call('STRLEN', data .. i) ~= size then return {CHUNK_MISSING, tostring(i)} end
end
-- segments: 'version that wrote it:token:bytes:bytes per chunk:chunks'
local segments, token_of = {}, {}
for item in string.gmatch(h[10] or '', '[^,]+') do
  local w, token = string.match(item, '^(%d+):(%x+):%d+:%d+:%d+$')
  if not w then return {MALFORMED_HEAD, 'segments'} end
  table.insert(segments, item)
  token_of[w] = token
end
local whole = string.match(h[5] or '', '^%d+:%d+:%d+$')
if h[3] and h[3] ~= '' and whole and not token_of[before] then
  table.insert(segments, before .. ':' .. h[3] .. ':' .. h[5])
  token_of[before] = h[3]
end
-- the current version's leaf map ('w': leaf of whole segment w; 'w.offset'; then each
-- link of its chain, '~v.offset.length'), if partial
local entries = nil
if (h[8] == '2' or h[8] == '3') and string.sub(h[9] or '', 1, #before + 1) == before .. '|' then
  entries = {}
  for e in string.gmatch(string.sub(h[9], #before + 2), '[^,]+') do table.insert(entries, e) end
end
local function refs(map)  -- the segments (by version) a leaf map references
  local seen, list = {}, {}
  local function add(w)
    if not w or not token_of[w] then return false end
    if not seen[w] then seen[w] = true; table.insert(list, w) end
    return true
  end
  for _, e in ipairs(map) do
    if not add(string.match(e, '^(%d+)')) then return nil end
    for w in string.gmatch(e, '~(%d+)') do
      if not add(w) then return nil end
    end
  end
  return list
end
local count = tonumber(ARGV[13])
local map = nil
if partial then
  map = {}
  for i = 1, count do map[i] = before end
  if entries then
    map = {}
    for i, e in ipairs(entries) do map[i] = e end
  end
  if #map ~= count then return {MALFORMED_HEAD, 'leaves'} end
  for index, offset in string.gmatch(ARGV[14], '(%d+)%.(%d+)') do
    map[tonumber(index) + 1] = now .. '.' .. offset
  end
  for index, offset, length in string.gmatch(patches, '(%d+)%.(%d+)%.(%d+)') do
    local i = tonumber(index) + 1
    if not map[i] then return {MALFORMED_HEAD, 'leaves'} end
    map[i] = map[i] .. '~' .. now .. '.' .. offset .. '.' .. length
  end
end
local fmt = '1'
if partial then
  fmt = '2'
  for _, e in ipairs(map) do
    if string.find(e, '~', 1, true) then fmt = '3'; break end
  end
end
-- retained items, newest first: 'token:bytes:bytes per chunk:chunks' (or 'token:chunks',
-- from before spares), then '/' and the segments it references if not only its own
local retained = {}
if h[3] and h[3] ~= '' then
  local item = h[3] .. ':' .. (whole and h[5] or '0')
  if entries then
    local list = refs(entries)
    if not list then return {MALFORMED_HEAD, 'leaves'} end
    item = item .. '/' .. table.concat(list, '.')
  end
  table.insert(retained, item)
end
for item in string.gmatch(h[4] or '', '[^,]+') do table.insert(retained, item) end
table.insert(segments, now .. ':' .. ARGV[2] .. ':' .. ARGV[3])
token_of[now] = ARGV[2]
local live = {}
if partial then
  local list = refs(map)
  if not list then return {MALFORMED_HEAD, 'leaves'} end
  for _, w in ipairs(list) do live[token_of[w]] = true end
else
  live[ARGV[2]] = true
end
local keep = tonumber(ARGV[5])
for index, item in ipairs(retained) do
  if index <= keep then
    local own, list = string.match(item, '^(%x+):[^/]*/?(.*)$')
    if list == '' then live[own or ''] = true end
    for w in string.gmatch(list or '', '%d+') do
      if token_of[w] then live[token_of[w]] = true end
    end
  end
end
local spare = h[6] or ''
local doomed = {}  -- the chunks of segments retired now: unlinked once published
local function retire(token, layout)  -- a segment no retained version references
  local count = tonumber(string.match(layout, '(%d+)$') or '0')
  if spare == '' and ARGV[11] == '1' and string.match(layout, '^[1-9]%d*:%d+:%d+$') then
    spare = token .. ':' .. layout  -- its chunks stay, for the next push to overwrite in place
  else
    for i = 0, count - 1 do table.insert(doomed, ARGV[6] .. token .. ':' .. i) end
  end
end
local kept, alive, known = {}, {}, {}
for _, item in ipairs(segments) do
  local token, layout = string.match(item, '^%d+:(%x+):(.*)$')
  known[token] = true
  if live[token] then table.insert(alive, item) else retire(token, layout) end
end
for index, item in ipairs(retained) do
  if index <= keep then
    table.insert(kept, item)
  else
    local token, layout = string.match(item, '^(%x+):([^/]*)')
    if token and not known[token] and not live[token] then retire(token, layout) end
  end
end
-- a push that does not recycle frees the spare a larger push (or another writer's
-- recycle_from) left, unless a kept version still reads it (only a damaged head says so)
if ARGV[11] ~= '1' and spare ~= '' then
  local token, layout = string.match(spare, '^(%x+):(%d+:%d+:%d+)$')
  if token and not live[token] and not known[token] and token ~= ARGV[2] then
    for i = 0, tonumber(string.match(layout, ':(%d+)$')) - 1 do
      table.insert(doomed, ARGV[6] .. token .. ':' .. i)
    end
  end
  spare = ''
end
for _, key in ipairs(doomed) do redis.call('EXISTS', key) end
-- every check is done: publish
for i = 0, chunks - 1 do redis.call('PERSIST', data .. i) end
-- the event waiters wake on. A stream whose top entry is not below this version (a
-- history that went back) refuses it and is started again: asking XADD, rather than
-- reading the top entry first, saves a command per push. Trimmed by whole nodes ('~'):
-- exact trimming cost each push more than the rest of its stream work.
local event = string.format('%d-1', version)
local added = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], event, 'v', now)
if type(added) == 'table' and added['err'] then
  if not string.find(added['err'], 'equal or smaller', 1, true) then
    return redis.error_reply(added['err'])
  end
  redis.call('DEL', KEYS[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], event, 'v', now)
end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'version', now, 'data', ARGV[2], 'layout', ARGV[3],
           'retained', table.concat(kept, ','), 'spare', spare, 'run', run,
           'fmt', fmt,
           'leaves', partial and (now .. '|' .. table.concat(map, ',')) or '',
           'segments', table.concat(alive, ','))
for _, key in ipairs(doomed) do redis.call('UNLINK', key) end
-- one string, not a table: Redis 6 writes a table's reply with a write(2) of its own after
-- the reply to the push's chunk SET (its length is deferred), one string goes with it
return PUBLISHED .. ' ' .. now .. ' ' .. epoch

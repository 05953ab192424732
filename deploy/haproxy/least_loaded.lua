-- least_loaded: picks the least-loaded server of the current backend for a request without affinity.
--
-- HAProxy 2.6 has one balance algorithm per backend, and `balance hdr(X-Session-Id)` sends a request
-- without the header round robin (the next server on the hash ring). A second `balance leastconn`
-- backend over the same servers would count only its own requests per server (each backend has its own
-- server objects), so it would not see the sessions the hash backend keeps on a server, and each
-- backend's `maxconn` would be a separate limit. This action reads the servers of the one backend
-- instead and stores the name of the least-loaded one in txn.least_loaded; the backend's
-- `use-server <name> if { var(txn.least_loaded) -m str <name> }` lines then send the request there.
--
--   http-request lua.least_loaded if !{ req.hdr(X-Session-Id) -m found }
--
-- A server is a candidate when it takes new requests (status UP..., or "no check"; not DRAIN, DOWN,
-- MAINT, not a backup) with an effective weight above 0 and has a free slot under its `maxconn`
-- (scur + qcur < slim; a server without maxconn always has one). Load is (scur + qcur + 1) / weight,
-- HAProxy's own leastconn measure, so the agent's KV-cache weights count. Ties go round robin. No
-- candidate (every server full): the variable stays unset and the backend's balance algorithm and queue
-- take over, bounded by its `timeout queue` and queue limit. See docs/load-balancing.md.
--
-- Loaded with `lua-load-per-thread`: each HAProxy thread has its own Lua state (no global Lua lock);
-- the round-robin turn is per thread, which is enough to spread ties.

local turn = 0

local function takes_new_requests(st)
  local status = st.status or ""
  if tonumber(st.bck) == 1 or (tonumber(st.weight) or 0) <= 0 then
    return false
  end
  return status == "no check" or status:sub(1, 2) == "UP"
end

core.register_action("least_loaded", { "http-req" }, function(txn)
  local px = core.backends[txn.f:be_name()]
  if px == nil then
    return
  end
  local names = {}
  for name in pairs(px.servers) do
    names[#names + 1] = name
  end
  local n = #names
  if n == 0 then
    return
  end
  table.sort(names)
  turn = (turn + 1) % n
  local best, best_load = nil, nil
  for i = 0, n - 1 do
    local name = names[(turn + i) % n + 1]
    local st = px.servers[name]:get_stats()
    if takes_new_requests(st) then
      local busy = (tonumber(st.scur) or 0) + (tonumber(st.qcur) or 0)
      local slim = tonumber(st.slim) or 0
      if slim == 0 or busy < slim then
        local load = (busy + 1) / tonumber(st.weight)
        if best_load == nil or load < best_load then
          best, best_load = name, load
        end
      end
    end
  end
  if best ~= nil then
    txn:set_var("txn.least_loaded", best)
  end
end, 0)
